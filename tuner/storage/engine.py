"""Connecting and migrating: the default URL, engine creation (SQLite pragmas and write locks), sessions, and Alembic.

:class:`Database` is the base of :class:`tuner.storage.Store`: it owns the engine and hands out one-transaction
sessions; the store's parts (trials, the job queue, the recommender's queries) build on :meth:`Database.session`.

Example:
    >>> import tempfile
    >>> with Database.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db") as database:
    ...     database.current_revision() is not None
    True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from tuner.storage.errors import StoreError
from tuner.storage.schema import VERSION_TABLE

DEFAULT_DB_FILE = "dstune.db"


def default_url() -> str:
    """``sqlite:///dstune.db``: a SQLite file in the current directory."""
    return f"sqlite:///{DEFAULT_DB_FILE}"


def migrations_dir() -> Path:
    """The Alembic environment, shipped inside the package (the repository's ``db/`` links here)."""
    return Path(__file__).resolve().parent / "migrations"


def configure_sqlite(engine: Engine) -> None:
    """Foreign keys on, a busy timeout, WAL for files, and BEGIN IMMEDIATE for writing transactions.

    pysqlite's deferred transactions upgrade a read lock to a write lock mid-transaction, which fails at once (no
    busy wait) when another connection wrote meanwhile; taking the write lock at BEGIN makes concurrent writers (the
    tuner and the API server on one file) wait their turn instead. This is SQLAlchemy's documented pysqlite recipe.
    A connection with the execution option ``dstune_write=True`` begins with ``BEGIN IMMEDIATE``.
    """
    in_memory = engine.url.database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let the "begin" hook below issue BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA busy_timeout = 30000")
        if not in_memory:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        write = connection.get_execution_options().get("dstune_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def create_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for ``url``: SQLite shared across threads (one static connection when in memory) with
    :func:`configure_sqlite`; other backends with ``pool_pre_ping``."""
    sa_url = sa.make_url(url)
    kwargs: dict[str, Any] = {"echo": echo, "future": True}
    if sa_url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        if sa_url.database in (None, "", ":memory:"):
            kwargs["poolclass"] = sa.pool.StaticPool  # one shared in-memory database
    else:
        kwargs["pool_pre_ping"] = True
    engine = sa.create_engine(sa_url, **kwargs)
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine)
    return engine


class Database:
    """An engine, its sessions and its migrations. Thread-safe.

    ``Database(url)`` only connects; :meth:`open` also migrates the schema to the newest revision.
    """

    def __init__(self, url: str | None = None, *, echo: bool = False) -> None:
        self.url = url or default_url()
        self.engine = create_engine(self.url, echo=echo)
        self._writer = self.engine.execution_options(dstune_write=True)
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._writer, expire_on_commit=False)
        self._migrate_lock = threading.Lock()

    @classmethod
    def open(cls, url: str | None = None, *, echo: bool = False) -> Self:
        """Connect to ``url`` (default :func:`default_url`) and apply pending migrations (``alembic upgrade head``)."""
        database = cls(url, echo=echo)
        try:
            database.upgrade()
        except BaseException:
            database.close()
            raise
        return database

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.url.render_as_string(hide_password=True)!r})"

    @contextlib.contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back (nothing written) if it raises."""
        factory = self._write_sessions if write else self._read_sessions
        with factory() as session, session.begin():
            yield session

    def alembic_config(self) -> Any:
        """An Alembic ``Config`` for this database and the ``db/`` environment (no alembic.ini needed)."""
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(migrations_dir()))
        config.set_main_option("sqlalchemy.url", self.engine.url.render_as_string(hide_password=False))
        return config

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema to ``revision``; an empty database gets every table. Leaves Optuna's tables alone."""
        from alembic import command

        location = migrations_dir()
        if not (location / "env.py").is_file():
            raise StoreError("migrations", f"Alembic environment not found at {location}")
        config = self.alembic_config()
        with self._migrate_lock, self._writer.connect() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
            connection.commit()

    def current_revision(self) -> str | None:
        """The schema revision recorded in ``dstune_alembic_version`` (None before the first migration)."""
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()


__all__ = ["DEFAULT_DB_FILE", "Database", "configure_sqlite", "create_engine", "default_url", "migrations_dir"]
