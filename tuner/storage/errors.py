"""The store's errors: both are :class:`tuner.errors.InputError` (a ``field`` and a message)."""

from __future__ import annotations

from tuner.errors import InputError


class StoreError(InputError):
    """A store operation that cannot proceed; ``field`` names the offending field.

    Example:
        >>> error = StoreError("study_id", "no study 7")
        >>> (error.field, isinstance(error, InputError))
        ('study_id', True)
    """


class DuplicateConfig(StoreError):
    """The study already holds a trial with this ``config_key``: identical configs are never run twice."""

    def __init__(self, study_id: int, config_key: str, existing_trial_id: int | None) -> None:
        super().__init__(
            "config_key", f"study {study_id} already has trial {existing_trial_id} with config key {config_key!r}"
        )
        self.study_id = study_id
        self.config_key = config_key
        self.existing_trial_id = existing_trial_id


__all__ = ["DuplicateConfig", "StoreError"]
