"""Free-form JSON a user sends (a ds_config, an adapter or quantization config, an inline ``config.json``, pins)
held to what every consumer can store and send back: finite numbers (``NaN``, ``Infinity`` and ``1e400`` parse in
Python's json but not in a JSON answer, and silently become ``null`` in a JSON column), strings without control
characters (PostgreSQL refuses ``\\u0000`` in text and JSON), nesting at most :data:`MAX_DEPTH` deep.

Example:
    >>> check_plain_data({"gradient_clipping": 1.0, "tags": ["a\\tb"]}, "ds_config")
    >>> check_plain_data({"optimizer": {"params": {"lr": float("nan")}}}, "ds_config")
    Traceback (most recent call last):
    tuner.errors.InputError: ds_config.optimizer.params.lr: must be a finite number, got nan
    >>> check_plain_data({"_name_or_path": "a\\x00b"}, "config")
    Traceback (most recent call last):
    tuner.errors.InputError: config._name_or_path: control characters (here \\x00) are not allowed in text
"""

from __future__ import annotations

import math
import re
from typing import Any

from tuner.errors import InputError

MAX_DEPTH = 64  # nesting of objects and lists: far beyond any config
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # C0 and DEL; tab, newline and carriage return are text


def check_text(text: str, field: str) -> None:
    """Refuse a string holding a control character other than tab, newline and carriage return."""
    found = _CONTROL.search(text)
    if found is not None:
        shown = repr(found.group())[1:-1]
        raise InputError(field, f"control characters (here {shown}) are not allowed in text")


def check_plain_data(value: Any, field: str) -> None:
    """Walk ``value`` (iteratively: no recursion limit to hit) and refuse the first non-finite number, control
    character (in a key or a string) or nesting past :data:`MAX_DEPTH`, naming its dotted path under ``field``."""
    pending: list[tuple[Any, str, int]] = [(value, field, 0)]
    while pending:
        item, path, depth = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InputError(path, f"must be a finite number, got {item}")
        if isinstance(item, str):
            check_text(item, path)
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise InputError(path, f"nested more than {MAX_DEPTH} deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    check_text(str(key), path)  # the key itself is not shown: it holds the control character
                    pending.append((child, f"{path}.{key}", depth + 1))
            else:
                pending.extend((child, f"{path}.{index}", depth + 1) for index, child in enumerate(item))


__all__ = ["MAX_DEPTH", "check_plain_data", "check_text"]
