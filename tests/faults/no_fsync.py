"""SQLite without fsync for test processes: :func:`skip_sqlite_fsync` makes every SQLite connection opened afterwards
by this process (the store's, Optuna's) run ``PRAGMA synchronous = OFF``, as the test PostgreSQL server runs with
``fsync = off``. A commit still reaches the operating system, so a killed process loses nothing (only a power cut
could); locking between processes is unchanged. The tuning loop commits several times a trial, and on a busy disk each
fsync waited milliseconds: 7 s of the 26 s the slowest loop test took."""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa


def _unsynced(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous = OFF")


def skip_sqlite_fsync() -> None:
    """From now on, SQLite connections of every SQLAlchemy engine in this process skip fsync (idempotent)."""
    if not sa.event.contains(sa.engine.Engine, "connect", _unsynced):
        sa.event.listen(sa.engine.Engine, "connect", _unsynced)
