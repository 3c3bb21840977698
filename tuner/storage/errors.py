"""The store's errors: :class:`StoreError` and :class:`DuplicateConfig` are :class:`tuner.errors.InputError` (a
``field`` and a message); :class:`DatabaseUnavailable` is not bad input but the database out of reach."""

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


class DatabaseUnavailable(Exception):
    """The database could not be reached (refused, shut down, connection lost) for longer than the store retries.

    ``retry_safe`` is False when the connection was lost while committing: the transaction may or may not have been
    applied, so it was not run again. The API answers 503 for it; the worker leaves its job to the lease.

    Example:
        >>> error = DatabaseUnavailable("postgresql://db/dstune", "connection refused")
        >>> str(error), isinstance(error, InputError)
        ('database postgresql://db/dstune unavailable: connection refused', False)
    """

    def __init__(self, url: str, detail: str, retry_safe: bool = True) -> None:
        super().__init__(f"database {url} unavailable: {detail}")
        self.url, self.detail, self.retry_safe = url, detail, retry_safe


__all__ = ["DatabaseUnavailable", "DuplicateConfig", "StoreError"]
