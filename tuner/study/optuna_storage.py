"""Optuna's RDB storage, made to ride out a database restart the way :class:`tuner.storage.Store` does.

Optuna turns a lost connection into ``StorageInternalError`` and gives up. :class:`RetryingRDBStorage` runs each
storage call again, with backoff, for up to ``retry_s`` seconds while the database is out of reach
(:func:`tuner.storage.is_disconnect` on the error or its cause), with pooled connections checked before use. Optuna
cannot say whether a lost commit landed; the one call where running it twice would fail, finishing a trial, is checked
on the retry: a trial already in the requested state counts as done. Creating Optuna's tables in a fresh database
from two processes at once (Optuna does not guard that) is tried again too. Optuna cannot remove a study's user
attribute: :meth:`RetryingRDBStorage.delete_study_user_attr` deletes its row.

Example:
    >>> import tempfile
    >>> storage = RetryingRDBStorage(f"sqlite:///{tempfile.mkdtemp()}/optuna.db", retry_s=5.0)
    >>> optuna.create_study(storage=storage, study_name="demo").study_name
    'demo'
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from tuner.storage import is_disconnect
from tuner.storage.engine import DEFAULT_RETRY_S, postgres_connect_args

_log = logging.getLogger(__name__)
_NOT_RETRIED = {"remove_session", "upgrade", "get_current_version", "get_head_version", "get_all_versions"}
TABLE_RACE_ATTEMPTS = 10
# what Optuna's _CachedStorage (the wrapper create_study puts around an RDBStorage) calls besides the public methods
_PRIVATE_CALLED = ("_create_new_trial", "_get_best_trial_id", "_get_stale_trial_ids", "_get_trials", "_set_trial_param")
# Optuna's table of study user attributes (optuna/storages/_rdb/models.py, StudyUserAttributeModel), as much as a
# delete needs
_STUDY_USER_ATTRIBUTES = sa.table("study_user_attributes", sa.column("study_id"), sa.column("key"))


def _retried(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        deadline, delay, attempt = time.monotonic() + self.retry_s, 0.1, 0
        while True:
            try:
                return method(self, *args, **kwargs)
            except optuna.exceptions.UpdateFinishedTrialError:
                if attempt and name == "set_trial_state_values" and self._already(*args, **kwargs):
                    return True  # the attempt whose connection was lost did commit
                raise
            except Exception as error:
                if not is_disconnect(error) or time.monotonic() + delay > deadline:
                    raise
                log = _log.debug if attempt else _log.warning  # one line per outage, not one per retry
                log("optuna storage: database unreachable (%s); retrying %s", type(error).__name__, name)
            attempt += 1
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    return call


class RetryingRDBStorage(RDBStorage):
    """:class:`optuna.storages.RDBStorage` whose calls survive a database restart (see the module docstring)."""

    def __init__(self, url: str, retry_s: float = DEFAULT_RETRY_S, **kwargs: Any) -> None:
        self.retry_s = retry_s
        engine_kwargs = dict(kwargs.pop("engine_kwargs", None) or {})
        if not url.startswith("sqlite"):
            engine_kwargs.setdefault("pool_pre_ping", True)
        if url.startswith("postgresql"):
            engine_kwargs.setdefault("connect_args", postgres_connect_args())
        for attempt in range(TABLE_RACE_ATTEMPTS):
            try:
                super().__init__(url, engine_kwargs=dict(engine_kwargs), **kwargs)
                return
            except sa.exc.DBAPIError as error:  # two processes creating Optuna's tables at once: one loses the race
                lost_race = isinstance(error, sa.exc.IntegrityError) or "already exists" in str(error)
                if attempt == TABLE_RACE_ATTEMPTS - 1 or not lost_race:
                    raise
                time.sleep(0.2 * (attempt + 1))  # let the winner finish creating the other tables

    def _already(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        return self.get_trial(trial_id).state == state

    def delete_study_user_attr(self, study_id: int, key: str) -> None:
        """Remove the study's user attribute ``key`` (nothing when it has none): Optuna offers no call for it."""
        table = _STUDY_USER_ATTRIBUTES
        with self.engine.begin() as connection:
            connection.execute(sa.delete(table).where(table.c.study_id == study_id, table.c.key == key))


for _name in dir(RDBStorage):
    _member = getattr(RDBStorage, _name)
    public = not _name.startswith("_") and _name not in _NOT_RETRIED
    if callable(_member) and (public or _name in _PRIVATE_CALLED):
        setattr(RetryingRDBStorage, _name, _retried(_name, _member))
RetryingRDBStorage.delete_study_user_attr = _retried(  # type: ignore[method-assign]
    "delete_study_user_attr", RetryingRDBStorage.delete_study_user_attr
)


__all__ = ["RetryingRDBStorage"]
