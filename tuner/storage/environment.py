"""Failures of the environment, not of the input: the database out of reach, a storage URL no driver speaks, a path
that cannot be written, a full disk. :func:`environment_failure` recognises them among whatever was raised (the
exception or what caused it) and says each in one line naming what and where; the CLI prints that line and exits 1,
the API answers 503. :func:`is_permanent` tells a start-up connection failure that waiting will not cure (an unknown
host, a refused password, a file that cannot be opened) from one it may (a refused connection during a restart).

Example:
    >>> import errno
    >>> failure = environment_failure(OSError(errno.ENOSPC, "No space left on device", "/dev/full"))
    >>> failure.what, str(failure), failure.disk_full
    ('disk', 'disk full: /dev/full: No space left on device', True)
    >>> environment_failure(ValueError("a bug")) is None
    True
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass

import sqlalchemy as sa

from tuner.storage.errors import DatabaseUnavailable

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR})
SQLITE_DISK_FULL = ("database or disk is full", "disk i/o error")
SQLITE_PATH = ("unable to open database file", "attempt to write a readonly database", "readonly database")
# a first connection failing with one of these will fail the same way for the whole retry window
PERMANENT = (
    "could not translate host name",
    "name or service not known",
    "nodename nor servname",
    "temporary failure in name resolution",
    "password authentication failed",
    "no password supplied",
    'role "',
    'database "',  # ... does not exist
    "no pg_hba.conf entry",
    "unable to open database file",
    "readonly database",
    "invalid dsn",
    "invalid connection option",
)


class StorageUnusable(Exception):
    """The storage at ``url`` (password hidden) cannot be used at all: waiting will not help (see the module doc)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"cannot use the database at {url}: {detail}")
        self.url, self.detail = url, detail


@dataclass(frozen=True)
class EnvironmentFailure:
    """One environment failure: ``what`` (database, storage, disk, path), ``where`` and ``detail``."""

    what: str
    where: str
    detail: str
    disk_full: bool = False

    def __str__(self) -> str:
        labels = {"database": "database unavailable", "disk": "disk full", "storage": "cannot use the database"}
        label = {**labels, "connection": "cannot connect"}.get(self.what, f"cannot write {self.what}")
        return f"{label}: {self.where}: {self.detail}" if self.where else f"{label}: {self.detail}"


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:300]


def _classify(error: BaseException) -> EnvironmentFailure | None:
    if isinstance(error, StorageUnusable):
        return EnvironmentFailure("storage", error.url, error.detail)
    if isinstance(error, DatabaseUnavailable):
        return EnvironmentFailure("database", error.url, _one_line(error.detail))
    if isinstance(error, sa.exc.NoSuchModuleError) or (isinstance(error, sa.exc.ArgumentError) and "URL" in str(error)):
        return EnvironmentFailure("storage", "", f"not a database URL dstune can use: {_one_line(error)}")
    if isinstance(error, sa.exc.OperationalError):
        text = str(error.orig).lower()
        if any(marker in text for marker in SQLITE_DISK_FULL):
            return EnvironmentFailure("disk", "database", _one_line(error.orig), disk_full=True)
        if any(marker in text for marker in SQLITE_PATH):
            return EnvironmentFailure("storage", "database file", _one_line(error.orig))
    if isinstance(error, ConnectionError) and error.errno is None:  # a client's own (Ray's: --ray-address unreachable)
        return EnvironmentFailure("connection", "", _one_line(error))
    if isinstance(error, OSError) and error.errno is not None:
        where = str(error.filename) if error.filename is not None else ""
        if error.errno in DISK_FULL_ERRNOS:
            return EnvironmentFailure("disk", where, error.strerror or _one_line(error), disk_full=True)
        if error.errno in PATH_ERRNOS and where:
            return EnvironmentFailure("path", where, error.strerror or _one_line(error))
    return None


def environment_failure(error: BaseException) -> EnvironmentFailure | None:
    """The environment failure ``error`` (or an exception in its cause chain) reports, or None for anything else."""
    for item in _chain(error):
        failure = _classify(item)
        if failure is not None:
            return failure
    return None


def is_permanent(error: BaseException) -> bool:
    """Whether a failed first connection will fail the same way however long one waits."""
    text = " ".join(str(getattr(item, "orig", None) or item) for item in _chain(error)).lower()
    return any(marker in text for marker in PERMANENT)


__all__ = ["EnvironmentFailure", "StorageUnusable", "environment_failure", "is_permanent"]
