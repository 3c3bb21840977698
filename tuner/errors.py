"""One error type for bad input: every error that blames one field of what the user gave derives from it.

The faces turn it into their own form without taking messages apart: the CLI prints ``field: message`` on one
line and exits 2, the API answers 422 with ``loc`` built from ``field``.

Example:
    >>> error = InputError("gpu_memory", "must be positive")
    >>> str(error), error.field, error.message
    ('gpu_memory: must be positive', 'gpu_memory', 'must be positive')
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input in ``field`` (a flag, a dotted ds_config key, a search-space key or a request path)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}" if field_name else message)
        self.field = field_name
        self.message = message
