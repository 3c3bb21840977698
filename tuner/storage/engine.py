"""Connecting and migrating: the default URL, engine creation (SQLite pragmas and write locks), sessions, and Alembic.

:class:`Database` is the base of :class:`tuner.storage.Store`: it owns the engine and hands out one-transaction
sessions; the store's parts (trials, the job queue, the recommender's queries) build on :meth:`Database.session`.

Losing the database (a PostgreSQL restart, a dropped connection) is survived, not just reported: pooled connections are
checked before use (``pool_pre_ping``), and every public method of a :class:`Database` subclass is retried as a whole
for up to ``retry_s`` seconds when the database is out of reach, where that is safe: the transaction failed before its
commit (the server rolled it back) or it only read. A connection lost during a writing commit is not retried (the
write may have landed). What cannot be done in time raises :class:`~tuner.storage.errors.DatabaseUnavailable`.

Example:
    >>> import tempfile
    >>> with Database.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db") as database:
    ...     database.current_revision() is not None
    True
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, Self, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from tuner import env
from tuner.env import DEFAULT_DB_FILE
from tuner.errors import InputError
from tuner.storage.environment import StorageUnusable, is_permanent
from tuner.storage.errors import DatabaseUnavailable, StoreError
from tuner.storage.tables import VERSION_TABLE

RETRY_ENV = "DSTUNE_DB_RETRY_S"
DEFAULT_RETRY_S = 60.0  # a PostgreSQL restart takes seconds; a failover tens of seconds
CONNECT_TIMEOUT_S = 10  # a host that does not answer at all fails the attempt instead of hanging it
# SQLSTATE classes: connection exception; operator intervention (shutdown); and the session the server ended for
# idling inside a transaction (25P03, see postgres_connect_args)
_DISCONNECT_STATES = ("08", "57P", "25P03")
_log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


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


def postgres_connect_args() -> dict[str, Any]:
    """What every PostgreSQL connection of dstune (its store and Optuna's storage) is opened with.

    A connect timeout, and ``idle_in_transaction_session_timeout`` (``$DSTUNE_DB_IDLE_TX_S``, 30 s): a process stopped
    or hung inside a transaction (SIGSTOP, a stalled host) holds its row locks until the server ends its session. The
    job queue claims with ``FOR UPDATE SKIP LOCKED``, so without the limit a worker stopped while it renewed its lease
    kept its job locked and no other worker ever saw the lease expire. dstune's transactions never idle for seconds.
    """
    idle_ms = round(env.current().db_idle_tx_s * 1000)
    return {"connect_timeout": CONNECT_TIMEOUT_S, "options": f"-c idle_in_transaction_session_timeout={idle_ms}"}


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
        if sa_url.get_backend_name() == "postgresql":
            kwargs["connect_args"] = postgres_connect_args()
    engine = sa.create_engine(sa_url, **kwargs)
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine)
    return engine


def is_disconnect(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) says the database is out of reach, not that the statement was wrong:
    a connection SQLAlchemy invalidated, a refused or failed connect (a driver error without SQLSTATE), or a server
    error of SQLSTATE class 08 (connection exception) or 57P (shutting down, starting up). SQLite errors ("database is
    locked") never are."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sa.exc.DBAPIError):
            if seen.connection_invalidated:
                return True
            if isinstance(seen, (sa.exc.OperationalError, sa.exc.InterfaceError)):
                orig = seen.orig
                state = getattr(orig, "sqlstate", getattr(orig, "pgcode", False))  # psycopg 3, psycopg2
                if state is None or (isinstance(state, str) and state.startswith(_DISCONNECT_STATES)):
                    return True
        seen = seen.__cause__ or seen.__context__
    return False


def _shown(url: str) -> str:
    """``url`` with its password hidden (an unparsable one not shown at all: it may hold a password)."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "(an unparsable URL)"


def default_retry_s() -> float:
    """How long a store keeps retrying an unreachable database: ``$DSTUNE_DB_RETRY_S``, else 60 s (:mod:`tuner.env`)."""
    return env.current().db_retry_s


FIRST_DELAY_S = 0.1  # the first retry's wait; each next one doubles, up to 2 s
STARTUP_RETRY_S = 3.0  # how long a database this process never reached is retried (a blip, not an outage)
_retrying_now = threading.local()  # depth of retried calls on this thread: nested store calls do not retry again


def retry_unavailable(method: Callable[P, T]) -> Callable[P, T]:
    """Run ``method`` (of a :class:`Database`) again while the database is unreachable and running it again is safe,
    with backoff, for up to the database's ``retry_s``; then raise :class:`DatabaseUnavailable`."""

    @functools.wraps(method)
    def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        if getattr(_retrying_now, "depth", 0):
            return method(*args, **kwargs)  # the outermost store call retries the whole operation
        database = args[0]
        assert isinstance(database, Database)
        _retrying_now.depth = 1
        try:
            deadline, delay = None, FIRST_DELAY_S
            while True:
                try:
                    result = method(*args, **kwargs)
                    database.reached = True
                    return result
                except (DatabaseUnavailable, sa.exc.DBAPIError) as error:
                    unavailable = database.unavailable(error)
                    if unavailable is None:
                        raise
                    now = time.monotonic()
                    if deadline is None:  # a database never reached yet is not waited for: a start-up answers fast
                        window = database.retry_s if database.reached else min(database.retry_s, STARTUP_RETRY_S)
                        deadline = now + window
                    if not unavailable.retry_safe or now + delay > deadline:
                        if unavailable is error:
                            raise
                        raise unavailable from error
                    if delay == FIRST_DELAY_S and database.reached:  # one line per outage, the rest at debug level
                        _log.warning("%s; retrying for up to %.0f s (DSTUNE_DB_RETRY_S)", unavailable, database.retry_s)
                    else:
                        _log.debug("%s; retrying %s in %.1f s", unavailable, method.__name__, delay)
                    time.sleep(delay)
                    delay = min(2 * delay, 2.0)
        finally:
            _retrying_now.depth = 0

    return retried


class Database:
    """An engine, its sessions and its migrations. Thread-safe.

    ``Database(url)`` only connects; :meth:`open` also migrates the schema to the newest revision. ``retry_s`` (default
    :func:`default_retry_s`) bounds how long a public method waits for an unreachable database (see the module doc);
    every public method a subclass defines is wrapped with :func:`retry_unavailable`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, member in list(vars(cls).items()):
            if not name.startswith("_") and callable(member) and not isinstance(member, (classmethod, staticmethod)):
                setattr(cls, name, retry_unavailable(member))

    def __init__(self, url: str | None = None, *, echo: bool = False, retry_s: float | None = None) -> None:
        self.url = env.storage_url(url)
        self.retry_s = default_retry_s() if retry_s is None else retry_s
        self.engine = create_engine(self.url, echo=echo)
        self._writer = self.engine.execution_options(dstune_write=True)
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._writer, expire_on_commit=False)
        self._migrate_lock = threading.Lock()
        self.reached = False  # whether this process has connected once: only then is an outage waited out

    @classmethod
    def open(cls, url: str | None = None, *, echo: bool = False, retry_s: float | None = None) -> Self:
        """Connect to ``url`` (default: :func:`tuner.env.storage_url`) and apply pending migrations
        (``alembic upgrade head``)."""
        try:
            database = cls(url, echo=echo, retry_s=retry_s)
        except sa.exc.ArgumentError as error:  # no such dialect, or no URL at all: the flag's input (exit 2, 422)
            shown, detail = _shown(url or env.storage_url()), " ".join(str(error).split())
            raise InputError("storage", f"{shown}: not a database URL dstune can use ({detail})") from None
        except ImportError as error:  # a dialect whose driver is not installed here: the environment's
            raise StorageUnusable(_shown(url or env.storage_url()), " ".join(str(error).split())) from error
        try:
            database.probe()
            database.upgrade()
        except BaseException:
            database.close()
            raise
        return database

    def probe(self) -> None:
        """Connect once, not retried: a failure that waiting will not cure (an unknown host, a refused password, a
        file that cannot be opened) raises :class:`StorageUnusable` at once; others are left to the retried calls."""
        try:
            with self.engine.connect():
                pass
            self.reached = True
        except sa.exc.DBAPIError as error:
            if is_permanent(error):
                detail = " ".join(str(error.orig or error).split())[:300]
                raise StorageUnusable(self.engine.url.render_as_string(hide_password=True), detail) from error

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.url.render_as_string(hide_password=True)!r})"

    def unavailable(self, error: BaseException) -> DatabaseUnavailable | None:
        """``error`` as a :class:`DatabaseUnavailable` when it says the database is out of reach, else None."""
        if isinstance(error, DatabaseUnavailable):
            return error
        if not is_disconnect(error):
            return None
        detail = " ".join(str(getattr(error, "orig", None) or error).split())[:300]
        return DatabaseUnavailable(self.engine.url.render_as_string(hide_password=True), detail)

    @contextlib.contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back (nothing written) if it raises.

        The database out of reach raises :class:`DatabaseUnavailable`; ``retry_safe`` is False only when a writing
        transaction lost its connection while committing."""
        factory = self._write_sessions if write else self._read_sessions
        with factory() as session:
            session.begin()
            try:
                yield session
                session.flush()
            except sa.exc.DBAPIError as error:
                with contextlib.suppress(sa.exc.SQLAlchemyError):
                    session.rollback()
                unavailable = self.unavailable(error)
                if unavailable is None:
                    raise
                raise unavailable from error
            try:
                session.commit()
            except sa.exc.DBAPIError as error:
                unavailable = self.unavailable(error)
                if unavailable is None:
                    raise
                unavailable.retry_safe = not write
                raise unavailable from error

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


for _name in ("upgrade", "current_revision"):  # probe is not retried: its point is the first attempt
    setattr(Database, _name, retry_unavailable(getattr(Database, _name)))

__all__ = [
    "DEFAULT_DB_FILE",
    "DEFAULT_RETRY_S",
    "RETRY_ENV",
    "Database",
    "configure_sqlite",
    "create_engine",
    "default_retry_s",
    "is_disconnect",
    "migrations_dir",
    "postgres_connect_args",
    "retry_unavailable",
]
