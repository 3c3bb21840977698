"""The results database: workloads, studies, trials, calibration and jobs (SQLAlchemy 2, migrated with Alembic).

One database URL serves SQLite (``sqlite:///dstune.db``, the default) and PostgreSQL
(``postgresql+psycopg://user@host/db``). Optuna's ``RDBStorage`` may share the same database, so optuna-dashboard can
read it: every table here is prefixed ``dstune_`` and Alembic keeps its revision in ``dstune_alembic_version``, apart
from Optuna's own ``alembic_version``. This module knows nothing of Optuna: a trial's ``number`` is just an integer the
caller chose (the Optuna trial number).

Every public method runs in one short transaction that commits or rolls back as a whole, and returns plain frozen
dataclasses (:class:`WorkloadRecord`, :class:`StudyRecord`, :class:`TrialRecord`, ...) copied out of the session, or
ids: nothing returned is attached to a session, so records stay readable after the store is closed and across threads.

Example:
    >>> import tempfile
    >>> from tuner.workload import Workload, model_from_param_count
    >>> store = Store.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db")
    >>> workload_id = store.upsert_workload(Workload(model_from_param_count(1e9)))
    >>> study = store.get_or_create_study("demo", workload_id, sampler="tpe", settings={"global_batch": 64})
    >>> trial_id = store.add_trial(study.id, 0, "k0", {"zero_optimization": {"stage": 2}}, {"stage": 2}, False, None)
    >>> store.start_trial(trial_id).status
    'running'
    >>> store.finish_trial(trial_id, "ok", {"tokens_per_s": 1234.5, "peak_bytes_per_rank": [7, 9]}).peak_bytes
    9
    >>> store.best_trial(study.id).id == trial_id
    True
    >>> store.close()
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from tuner.errors import InputError
from tuner.workload import Workload, workload_from_dict, workload_to_dict

DEFAULT_DB_FILE = "dstune.db"
TABLE_PREFIX = "dstune_"
VERSION_TABLE = "dstune_alembic_version"
TRIAL_STATUSES = ("pending", "running", "pruned", "ok", "oom", "error", "timeout", "invalid_config", "failed")
FINISHED_STATUSES = ("pruned", "ok", "oom", "error", "timeout", "invalid_config", "failed")
RETRYABLE_STATUSES = ("pending", "failed", "error", "timeout")  # start_trial accepts these
STUDY_STATUSES = ("created", "running", "finished", "interrupted", "failed")
JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")
STALE_ERROR = "stale: the process running this trial died (marked failed on resume)"
TRIAL_ORDERS = ("id", "number", "tokens_per_s", "peak_bytes", "estimated_peak_bytes", "created_at", "finished_at")


def default_url() -> str:
    """``sqlite:///dstune.db``: a SQLite file in the current directory."""
    return f"sqlite:///{DEFAULT_DB_FILE}"


def migrations_dir() -> Path:
    """The Alembic environment, shipped inside the package (the repository's ``db/`` links here)."""
    return Path(__file__).resolve().parent / "migrations"


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (what every timestamp column holds)."""
    return datetime.now(timezone.utc)


class StoreError(InputError):
    """A store operation that cannot proceed; ``field`` names the offending field."""


class DuplicateConfig(StoreError):
    """The study already holds a trial with this ``config_key``: identical configs are never run twice."""

    def __init__(self, study_id: int, config_key: str, existing_trial_id: int | None) -> None:
        super().__init__(
            "config_key", f"study {study_id} already has trial {existing_trial_id} with config key {config_key!r}"
        )
        self.study_id = study_id
        self.config_key = config_key
        self.existing_trial_id = existing_trial_id


# --------------------------------------------------------------------------------------------------------------- schema


class UTCDateTime(sa.TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always hands back aware UTC datetimes (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


# JSON everywhere; JSONB on PostgreSQL. A Python None is SQL NULL (not the JSON literal null).
JSONType = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of dstune's tables (``Base.metadata`` is what Alembic migrates)."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
    }


class WorkloadRow(Base):
    """A workload, unique by :meth:`Workload.fingerprint`; the full ``workload_to_dict`` JSON in ``workload``."""

    __tablename__ = "dstune_workloads"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(sa.String(64), unique=True)
    model_family: Mapped[str] = mapped_column(sa.String(64))
    model_name: Mapped[str] = mapped_column(sa.String(255))
    n_params: Mapped[int] = mapped_column(sa.BigInteger)
    world_size: Mapped[int]
    device: Mapped[str] = mapped_column(sa.String(16))
    gpu_memory: Mapped[int] = mapped_column(sa.BigInteger)
    workload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StudyRow(Base):
    """A named search over one workload; ``optuna_study_name`` names the Optuna study sharing the database."""

    __tablename__ = "dstune_studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255), unique=True)
    workload_id: Mapped[int] = mapped_column(sa.ForeignKey("dstune_workloads.id", ondelete="RESTRICT"), index=True)
    sampler: Mapped[str] = mapped_column(sa.String(64))
    objectives: Mapped[list[Any]]
    settings: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(sa.String(16), default="created")
    optuna_study_name: Mapped[str | None] = mapped_column(sa.String(512))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class TrialRow(Base):
    """One ds_config tried in a study: its estimate, and (unless pruned) the measured run."""

    __tablename__ = "dstune_trials"
    __table_args__ = (
        sa.UniqueConstraint("study_id", "config_key"),
        sa.Index("ix_dstune_trials_study_id_number", "study_id", "number"),
        sa.Index("ix_dstune_trials_study_id_status_tokens_per_s", "study_id", "status", "tokens_per_s"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(sa.ForeignKey("dstune_studies.id", ondelete="CASCADE"))
    number: Mapped[int]
    config_key: Mapped[str] = mapped_column(sa.String(128))
    ds_config: Mapped[dict[str, Any]]
    activation_checkpointing: Mapped[bool] = mapped_column(default=False)
    params: Mapped[dict[str, Any] | None]
    estimate: Mapped[dict[str, Any] | None]
    estimated_peak_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    status: Mapped[str] = mapped_column(sa.String(16))
    prune_reason: Mapped[str | None] = mapped_column(sa.Text)
    constraint: Mapped[float | None]
    measurement: Mapped[dict[str, Any] | None]
    tokens_per_s: Mapped[float | None]
    peak_bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    error: Mapped[str | None] = mapped_column(sa.Text)
    attempts: Mapped[int] = mapped_column(default=0)
    hardware: Mapped[str | None] = mapped_column(sa.String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None]


class CalibrationRow(Base):
    """What measurements taught about the estimator on one kind of hardware for one model family."""

    __tablename__ = "dstune_calibration"
    __table_args__ = (sa.UniqueConstraint("hardware", "model_family"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    hardware: Mapped[str] = mapped_column(sa.String(128))
    model_family: Mapped[str] = mapped_column(sa.String(64))
    margin: Mapped[float]
    samples: Mapped[int] = mapped_column(default=0)
    stats: Mapped[dict[str, Any] | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class JobRow(Base):
    """A queued tuning request (for the job queue of the API server and workers)."""

    __tablename__ = "dstune_jobs"
    __table_args__ = (sa.Index("ix_dstune_jobs_status_created_at", "status", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_name: Mapped[str] = mapped_column(sa.String(255), index=True)
    request: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(sa.String(16), default="queued")
    worker: Mapped[str | None] = mapped_column(sa.String(255))
    progress: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


TABLES = tuple(sorted(Base.metadata.tables))

# ------------------------------------------------------------------------------------------------------------- records

R = TypeVar("R")


RowT = TypeVar("RowT", bound=Base)


def _existing(session: Session, model: type[RowT], row_id: int, what: str, **options: Any) -> RowT:
    """The ``model`` row with primary key ``row_id`` (``options`` go to ``Session.get``, e.g. ``with_for_update``);
    a missing one is a :class:`StoreError` on the field ``{what}_id``."""
    row = session.get(model, row_id, **options)
    if row is None:
        raise StoreError(f"{what}_id", f"no {what} {row_id}")
    return row


def _record(cls: type[R], row: Base) -> R:
    return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorkloadRecord:
    """A stored workload (``workload`` is :func:`workload_to_dict`'s output)."""

    id: int
    fingerprint: str
    model_family: str
    model_name: str
    n_params: int
    world_size: int
    device: str
    gpu_memory: int
    workload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class StudyRecord:
    """A stored study."""

    id: int
    name: str
    workload_id: int
    sampler: str
    objectives: list[Any]
    settings: dict[str, Any]
    status: str
    optuna_study_name: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class TrialRecord:
    """A stored trial. Sizes in bytes, ``tokens_per_s`` from the measurement, ``peak_bytes`` the max over ranks."""

    id: int
    study_id: int
    number: int
    config_key: str
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    params: dict[str, Any] | None
    estimate: dict[str, Any] | None
    estimated_peak_bytes: int | None
    status: str
    prune_reason: str | None
    constraint: float | None
    measurement: dict[str, Any] | None
    tokens_per_s: float | None
    peak_bytes: int | None
    error: str | None
    attempts: int
    hardware: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None


@dataclass(frozen=True)
class CalibrationRecord:
    """Estimator calibration for (hardware, model family): ``stats`` summarises measured/estimated peaks."""

    id: int
    hardware: str
    model_family: str
    margin: float
    samples: int
    stats: dict[str, Any] | None
    updated_at: datetime


@dataclass(frozen=True)
class StudySummary:
    """Trial counts by status (every status present, zeros included), pruned reasons and the best trial."""

    study: StudyRecord
    total: int
    counts: dict[str, int]
    pruned_reasons: dict[str, int]
    best: TrialRecord | None


def reason_kind(reason: str) -> str:
    """A prune reason with its numbers replaced by ``N``, so reasons of one kind share a histogram bucket.

    Example:
        >>> reason_kind("GPU memory short by 1073741824 bytes at the backward phase (largest category: activations)")
        'GPU memory short by N bytes at the backward phase (largest category: activations)'
    """
    return re.sub(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", "N", reason)


def _as_dict(value: Any) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    to_dict = getattr(value, "to_dict", None)
    if to_dict is None:
        raise StoreError("value", f"expected a dict or an object with to_dict(), got {type(value).__name__}")
    return to_dict()


# --------------------------------------------------------------------------------------------------------------- store


def _configure_sqlite(engine: Engine) -> None:
    """Foreign keys on, a busy timeout, WAL for files, and BEGIN IMMEDIATE for writing transactions.

    pysqlite's deferred transactions upgrade a read lock to a write lock mid-transaction, which fails at once (no
    busy wait) when another connection wrote meanwhile; taking the write lock at BEGIN makes concurrent writers (the
    tuner and the API server on one file) wait their turn instead. This is SQLAlchemy's documented pysqlite recipe.
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


class Store:
    """Access to the results database. Thread-safe; one per process is enough (use :meth:`open`).

    ``Store(url)`` only connects; :meth:`Store.open` also migrates the schema to the newest revision, which is what the
    tuner, the CLI and the API server should call.
    """

    def __init__(self, url: str | None = None, *, echo: bool = False) -> None:
        self.url = url or default_url()
        sa_url = sa.make_url(self.url)
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        if sa_url.get_backend_name() == "sqlite":
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if sa_url.database in (None, "", ":memory:"):
                kwargs["poolclass"] = sa.pool.StaticPool  # one shared in-memory database
        else:
            kwargs["pool_pre_ping"] = True
        self.engine = sa.create_engine(sa_url, **kwargs)
        if self.engine.dialect.name == "sqlite":
            _configure_sqlite(self.engine)
        self._writer = self.engine.execution_options(dstune_write=True)
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._writer, expire_on_commit=False)
        self._migrate_lock = threading.Lock()

    @classmethod
    def open(cls, url: str | None = None, *, echo: bool = False) -> Store:
        """Connect to ``url`` (default :func:`default_url`) and apply pending migrations (``alembic upgrade head``)."""
        store = cls(url, echo=echo)
        try:
            store.upgrade()
        except BaseException:
            store.close()
            raise
        return store

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Store({self.engine.url.render_as_string(hide_password=True)!r})"

    # ---------------------------------------------------------------------------------------------------- migrations

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

    # ------------------------------------------------------------------------------------------------------ sessions

    @contextlib.contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """A session in one transaction: committed when the block ends, rolled back (nothing written) if it raises."""
        factory = self._write_sessions if write else self._read_sessions
        with factory() as session, session.begin():
            yield session

    # ----------------------------------------------------------------------------------------------------- workloads

    def upsert_workload(self, workload: Workload) -> int:
        """The id of the workload with this fingerprint, inserting it first if new (the first name seen is kept)."""
        fingerprint = workload.fingerprint()
        for _ in range(2):  # a concurrent insert of the same fingerprint: read the winner's id
            try:
                with self.session() as session:
                    found = session.scalar(sa.select(WorkloadRow.id).where(WorkloadRow.fingerprint == fingerprint))
                    if found is not None:
                        return found
                    row = WorkloadRow(
                        fingerprint=fingerprint,
                        model_family=workload.model.family,
                        model_name=workload.model.name,
                        n_params=workload.model.n_params,
                        world_size=workload.cluster.world_size,
                        device=workload.cluster.device,
                        gpu_memory=workload.cluster.gpu_memory,
                        workload=workload_to_dict(workload),
                    )
                    session.add(row)
                    session.flush()
                    return row.id
            except IntegrityError:
                continue
        raise StoreError("workload", f"cannot insert or find workload {fingerprint}")

    def get_workload(self, workload_id: int) -> WorkloadRecord:
        """A stored workload by id (StoreError if missing)."""
        with self.session(write=False) as session:
            return _record(WorkloadRecord, _existing(session, WorkloadRow, workload_id, "workload"))

    def workload_of(self, study_id: int) -> Workload:
        """The :class:`Workload` a study searches configs for (rebuilt from the stored JSON)."""
        with self.session(write=False) as session:
            study = _existing(session, StudyRow, study_id, "study")
            row = session.get(WorkloadRow, study.workload_id)
            assert row is not None  # the foreign key guarantees it
            return workload_from_dict(row.workload)

    # ------------------------------------------------------------------------------------------------------- studies

    def get_or_create_study(
        self,
        name: str,
        workload_id: int,
        sampler: str,
        settings: dict[str, Any],
        objectives: list[Any] | None = None,
        optuna_study_name: str | None = None,
    ) -> StudyRecord:
        """The study called ``name``, created if new; an existing one is resumed as stored.

        Resuming checks the workload: a study of another workload raises :class:`StoreError` with ``field ==
        "workload"``. Sampler, objectives and settings are not checked: the stored ones are returned, for the caller to
        compare. ``objectives`` defaults to ``["tokens_per_s:maximize"]``, ``optuna_study_name`` to ``name``.
        """
        if not name:
            raise StoreError("name", "a study needs a name")
        for _ in range(2):
            try:
                with self.session() as session:
                    row = session.scalar(sa.select(StudyRow).where(StudyRow.name == name))
                    if row is None:
                        if session.get(WorkloadRow, workload_id) is None:
                            raise StoreError("workload_id", f"no workload {workload_id}")
                        row = StudyRow(
                            name=name,
                            workload_id=workload_id,
                            sampler=sampler,
                            objectives=list(objectives or ["tokens_per_s:maximize"]),
                            settings=dict(settings),
                            status="created",
                            optuna_study_name=optuna_study_name or name,
                        )
                        session.add(row)
                        session.flush()
                    elif row.workload_id != workload_id:
                        stored = session.get(WorkloadRow, row.workload_id)
                        given = session.get(WorkloadRow, workload_id)
                        raise StoreError(
                            "workload",
                            f"study {name!r} was created for workload {row.workload_id} "
                            f"({stored.fingerprint if stored else '?'}), not workload {workload_id} "
                            f"({given.fingerprint if given else 'missing'}); choose another study name",
                        )
                    return _record(StudyRecord, row)
            except IntegrityError:
                continue  # created concurrently: read it
        raise StoreError("name", f"cannot create or find study {name!r}")

    def get_study(self, name_or_id: str | int) -> StudyRecord | None:
        """A study by name (str) or id (int), or None."""
        with self.session(write=False) as session:
            if isinstance(name_or_id, int):
                row = session.get(StudyRow, name_or_id)
            else:
                row = session.scalar(sa.select(StudyRow).where(StudyRow.name == name_or_id))
            return None if row is None else _record(StudyRecord, row)

    def list_studies(self) -> list[StudyRecord]:
        """Every study, newest first."""
        with self.session(write=False) as session:
            rows = session.scalars(sa.select(StudyRow).order_by(StudyRow.created_at.desc(), StudyRow.id.desc()))
            return [_record(StudyRecord, row) for row in rows]

    def set_study_status(self, study_id: int, status: str) -> StudyRecord:
        """Set a study's status (one of :data:`STUDY_STATUSES`)."""
        if status not in STUDY_STATUSES:
            raise StoreError("status", f"must be one of {', '.join(STUDY_STATUSES)}, got {status!r}")
        with self.session() as session:
            row = _existing(session, StudyRow, study_id, "study")
            row.status = status
            session.flush()
            return _record(StudyRecord, row)

    # -------------------------------------------------------------------------------------------------------- trials

    def add_trial(
        self,
        study_id: int,
        number: int,
        config_key: str,
        ds_config: dict[str, Any],
        params: dict[str, Any] | None,
        activation_checkpointing: bool,
        estimate: Any,
        status: str = "pending",
        prune_reason: str | None = None,
        constraint: float | None = None,
        hardware: str | None = None,
    ) -> int:
        """Record a trial and return its id.

        ``estimate`` is a ``MemoryEstimate`` or its ``to_dict()`` (``per_gpu.total`` becomes ``estimated_peak_bytes``).
        A ``config_key`` the study already has raises :class:`DuplicateConfig` and writes nothing. A pruned trial is
        finished on arrival (``finished_at`` set).
        """
        if status not in TRIAL_STATUSES or status == "running":
            raise StoreError("status", f"a new trial must be pending or finished, got {status!r}")
        estimate_dict = _as_dict(estimate)
        peak = (estimate_dict or {}).get("per_gpu", {}).get("total")
        now = utcnow()
        try:
            with self.session() as session:
                _existing(session, StudyRow, study_id, "study")
                row = TrialRow(
                    study_id=study_id,
                    number=number,
                    config_key=config_key,
                    ds_config=ds_config,
                    activation_checkpointing=bool(activation_checkpointing),
                    params=params,
                    estimate=estimate_dict,
                    estimated_peak_bytes=None if peak is None else int(peak),
                    status=status,
                    prune_reason=prune_reason,
                    constraint=constraint,
                    hardware=hardware,
                    attempts=0,
                    created_at=now,
                    finished_at=None if status == "pending" else now,
                )
                session.add(row)
                session.flush()
                return row.id
        except IntegrityError as error:
            existing = self.find_trial_by_key(study_id, config_key)
            if existing is None:
                raise StoreError("trial", f"cannot insert trial: {error.orig}") from error
            raise DuplicateConfig(study_id, config_key, existing.id) from None

    def add_infeasible(
        self, study_id: int, number: int, params: dict[str, Any], reason: str, hardware: str | None = None
    ) -> int:
        """Record a pruned trial whose parameters build no ds_config at all (the space rejected them).

        Its ``config_key`` is ``infeasible:<number>`` and its ``ds_config`` empty: every such Optuna trial is recorded.
        """
        return self.add_trial(
            study_id,
            number,
            f"infeasible:{number}",
            {},
            params,
            False,
            None,
            status="pruned",
            prune_reason=reason,
            constraint=1.0,
            hardware=hardware,
        )

    def find_trial_by_key(self, study_id: int, config_key: str) -> TrialRecord | None:
        """The study's trial with this config key, or None."""
        with self.session(write=False) as session:
            row = session.scalar(
                sa.select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.config_key == config_key)
            )
            return None if row is None else _record(TrialRecord, row)

    def get_trial(self, trial_id: int) -> TrialRecord:
        """A trial by id (StoreError if missing)."""
        with self.session(write=False) as session:
            return _record(TrialRecord, _existing(session, TrialRow, trial_id, "trial"))

    def start_trial(self, trial_id: int, hardware: str | None = None) -> TrialRecord:
        """Mark a trial running: ``started_at`` now, ``attempts`` + 1, earlier results cleared.

        Allowed from pending and from the retryable failures (failed, error, timeout); otherwise StoreError.
        """
        with self.session() as session:
            row = _existing(session, TrialRow, trial_id, "trial")
            if row.status not in RETRYABLE_STATUSES:
                raise StoreError("status", f"trial {trial_id} is {row.status}; cannot start it")
            row.status = "running"
            row.attempts += 1
            row.started_at = utcnow()
            row.finished_at = row.duration_s = row.measurement = row.tokens_per_s = row.peak_bytes = row.error = None
            if hardware is not None:
                row.hardware = hardware
            session.flush()
            return _record(TrialRecord, row)

    def retry_trial(self, trial_id: int, number: int) -> TrialRecord:
        """Make a failed (or error/timeout) trial pending again under a new Optuna trial ``number``.

        The config is not run twice by accident: only the retryable statuses may be retried, and ``attempts`` keeps
        counting (:meth:`start_trial` increments it).
        """
        with self.session() as session:
            row = _existing(session, TrialRow, trial_id, "trial")
            if row.status not in RETRYABLE_STATUSES or row.status == "running":
                raise StoreError("status", f"trial {trial_id} is {row.status}; cannot retry it")
            row.number = number
            row.status = "pending"
            row.started_at = row.finished_at = row.duration_s = None
            row.measurement = row.tokens_per_s = row.peak_bytes = row.error = None
            session.flush()
            return _record(TrialRecord, row)

    def finish_trial(
        self, trial_id: int, status: str, measurement: Any = None, error: str | None = None
    ) -> TrialRecord:
        """Record a trial's outcome (``measurement`` is a ``Measurement`` or its ``to_dict()``).

        Fills ``tokens_per_s``, ``peak_bytes`` (the max over ``peak_bytes_per_rank``), ``error`` (the argument, else
        the measurement's), ``finished_at`` and ``duration_s`` (since ``started_at``). Allowed from pending or running.
        """
        if status not in FINISHED_STATUSES:
            raise StoreError("status", f"must be one of {', '.join(FINISHED_STATUSES)}, got {status!r}")
        data = _as_dict(measurement)
        with self.session() as session:
            row = _existing(session, TrialRow, trial_id, "trial")
            if row.status not in ("pending", "running"):
                raise StoreError("status", f"trial {trial_id} is already {row.status}")
            now = utcnow()
            row.status = status
            row.measurement = data
            if data is not None:
                tokens = data.get("tokens_per_s")
                row.tokens_per_s = None if tokens is None else float(tokens)
                peaks = [int(p) for p in data.get("peak_bytes_per_rank") or [] if p is not None]
                row.peak_bytes = max(peaks) if peaks else None
            row.error = error if error is not None else (data or {}).get("error")
            row.finished_at = now
            if row.started_at is not None:
                started = row.started_at if row.started_at.tzinfo else row.started_at.replace(tzinfo=timezone.utc)
                row.duration_s = (now - started).total_seconds()
            session.flush()
            return _record(TrialRecord, row)

    def mark_stale_running_failed(self, study_id: int, older_than: timedelta | None = None) -> list[int]:
        """Mark the study's running trials failed (their process died); returns their ids.

        Call on resume, before dispatching: a trial left running by a killed process would otherwise stay running
        forever. ``older_than`` spares trials started more recently than that.
        """
        with self.session() as session:
            query = sa.select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.status == "running")
            if older_than is not None:
                query = query.where(TrialRow.started_at < utcnow() - older_than)
            rows = list(session.scalars(query.order_by(TrialRow.id).with_for_update()))
            now = utcnow()
            for row in rows:
                row.status = "failed"
                row.error = STALE_ERROR
                row.finished_at = now
            return [row.id for row in rows]

    def trials(
        self,
        study_id: int,
        status: str | Iterable[str] | None = None,
        order_by: str = "number",
        limit: int | None = None,
        offset: int = 0,
    ) -> list[TrialRecord]:
        """The study's trials, filtered by status (one or several), sorted by ``order_by`` (a column of
        :data:`TRIAL_ORDERS`, ``-`` prefix for descending; ties by id), paged with ``limit``/``offset``."""
        column_name = order_by.removeprefix("-")
        if column_name not in TRIAL_ORDERS:
            raise StoreError("order_by", f"must be one of {', '.join(TRIAL_ORDERS)} (optionally '-'), got {order_by!r}")
        column = getattr(TrialRow, column_name)
        key = column.desc().nulls_last() if order_by.startswith("-") else column.asc().nulls_last()
        query = sa.select(TrialRow).where(TrialRow.study_id == study_id)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            query = query.where(TrialRow.status.in_(statuses))
        query = query.order_by(key, TrialRow.id).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self.session(write=False) as session:
            return [_record(TrialRecord, row) for row in session.scalars(query)]

    def best_trial(self, study_id: int) -> TrialRecord | None:
        """The ok trial with the highest ``tokens_per_s`` (the earliest on a tie), or None."""
        best = self.trials(study_id, status="ok", order_by="-tokens_per_s", limit=1)
        return best[0] if best and best[0].tokens_per_s is not None else None

    def study_summary(self, study_id: int) -> StudySummary:
        """Counts by status and the histogram of pruned reasons (by :func:`reason_kind`)."""
        with self.session(write=False) as session:
            study = _record(StudyRecord, _existing(session, StudyRow, study_id, "study"))
            counts = dict.fromkeys(TRIAL_STATUSES, 0)
            for status, count in session.execute(
                sa.select(TrialRow.status, sa.func.count())
                .where(TrialRow.study_id == study_id)
                .group_by(TrialRow.status)
            ):
                counts[status] = count
            reasons: dict[str, int] = {}
            for reason, count in session.execute(
                sa.select(TrialRow.prune_reason, sa.func.count())
                .where(TrialRow.study_id == study_id, TrialRow.status == "pruned")
                .group_by(TrialRow.prune_reason)
            ):
                kind = reason_kind(reason) if reason else "(no reason)"
                reasons[kind] = reasons.get(kind, 0) + count
        ordered = dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0])))
        return StudySummary(study, sum(counts.values()), counts, ordered, self.best_trial(study_id))

    # --------------------------------------------------------------------------------------------------- calibration

    def get_calibration(self, hardware: str, model_family: str) -> CalibrationRecord | None:
        """The calibration for (hardware, model family), or None."""
        with self.session(write=False) as session:
            row = session.scalar(
                sa.select(CalibrationRow).where(
                    CalibrationRow.hardware == hardware, CalibrationRow.model_family == model_family
                )
            )
            return None if row is None else _record(CalibrationRecord, row)

    def put_calibration(
        self, hardware: str, model_family: str, margin: float, samples: int, stats: dict[str, Any] | None = None
    ) -> CalibrationRecord:
        """Insert or replace the calibration for (hardware, model family)."""
        for _ in range(2):
            try:
                with self.session() as session:
                    row = session.scalar(
                        sa.select(CalibrationRow).where(
                            CalibrationRow.hardware == hardware, CalibrationRow.model_family == model_family
                        )
                    )
                    if row is None:
                        row = CalibrationRow(hardware=hardware, model_family=model_family)
                        session.add(row)
                    row.margin = float(margin)
                    row.samples = int(samples)
                    row.stats = stats
                    row.updated_at = utcnow()
                    session.flush()
                    return _record(CalibrationRecord, row)
            except IntegrityError:
                continue
        raise StoreError("calibration", f"cannot store calibration for {hardware}/{model_family}")

    # ---------------------------------------------------------------------------------------------------------- jobs

    def enqueue_job(self, study_name: str, request: dict[str, Any]) -> JobRecord:
        """Queue a tuning job (``request`` is the JSON the worker rebuilds the study from); returns it, queued."""
        if not study_name:
            raise StoreError("study_name", "a job needs a study name")
        with self.session() as session:
            row = JobRow(study_name=study_name, request=dict(request), status="queued", created_at=utcnow())
            session.add(row)
            session.flush()
            return _record(JobRecord, row)

    def claim_next_job(self, worker: str) -> JobRecord | None:
        """Take the oldest queued job for ``worker`` (now running), or None: no job is ever taken twice.

        PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent claimers skip each other's row and never wait).
        SQLite ignores ``FOR UPDATE``; its writing transactions start with ``BEGIN IMMEDIATE`` (the database's write
        lock), so select-then-update is serialised between processes and threads alike. Either way the update also
        requires ``status = 'queued'`` and checks the row count, so a lost race can never double-claim.
        """
        return self._claim(worker, None)

    def claim_job(self, job_id: int, worker: str) -> JobRecord | None:
        """Take this very job for ``worker`` if it is still queued (as :meth:`claim_next_job`), else None."""
        return self._claim(worker, job_id)

    def _claim(self, worker: str, job_id: int | None) -> JobRecord | None:
        with self.session() as session:
            queued = sa.select(JobRow.id).where(JobRow.status == "queued")
            if job_id is not None:
                queued = queued.where(JobRow.id == job_id)
            job_id = session.scalar(queued.order_by(JobRow.id).limit(1).with_for_update(skip_locked=True))
            if job_id is None:
                return None
            result = session.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == "queued")
                .values(status="running", worker=worker, started_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if result.rowcount != 1:
                return None
            row = session.get(JobRow, job_id, populate_existing=True)
            assert row is not None
            return _record(JobRecord, row)

    def get_job(self, job_id: int) -> JobRecord | None:
        """A job by id, or None."""
        with self.session(write=False) as session:
            row = session.get(JobRow, job_id)
            return None if row is None else _record(JobRecord, row)

    def list_jobs(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[JobRecord]:
        """Jobs, newest first, optionally of one status, paged."""
        query = sa.select(JobRow)
        if status is not None:
            query = query.where(JobRow.status == status)
        query = query.order_by(JobRow.id.desc()).offset(offset).limit(limit)
        with self.session(write=False) as session:
            return [_record(JobRecord, row) for row in session.scalars(query)]

    def cancel_job(self, job_id: int) -> JobRecord:
        """Cancel a job: a queued one is cancelled at once; a running one becomes ``cancel_requested`` (its worker
        stops the study between trials and marks it cancelled); a finished one is returned unchanged."""
        with self.session() as session:
            row = _existing(session, JobRow, job_id, "job", with_for_update=True)
            if row.status == "queued":
                row.status = "cancelled"
                row.finished_at = utcnow()
            elif row.status == "running":
                row.status = "cancel_requested"
            session.flush()
            return _record(JobRecord, row)

    def update_job_progress(self, job_id: int, progress: dict[str, Any]) -> JobRecord:
        """Merge ``progress`` into the job's progress JSON (its keys replace the same keys; others stay, such as the
        Ray submission id a submitting worker wrote); returns the job (its status tells the worker whether to stop)."""
        with self.session() as session:
            # locked: two writers (worker, submitter) lose nothing
            row = _existing(session, JobRow, job_id, "job", with_for_update=True)
            row.progress = {**(row.progress or {}), **progress}
            session.flush()
            return _record(JobRecord, row)

    def finish_job(self, job_id: int, status: str, error: str | None = None) -> JobRecord:
        """End a job: ``done``, ``failed`` or ``cancelled`` (``finished_at`` now)."""
        if status not in ("done", "failed", "cancelled"):
            raise StoreError("status", f"a job finishes done, failed or cancelled, got {status!r}")
        with self.session() as session:
            row = _existing(session, JobRow, job_id, "job")
            row.status = status
            row.error = error
            row.finished_at = utcnow()
            session.flush()
            return _record(JobRecord, row)


@dataclass(frozen=True)
class JobRecord:
    """A queued tuning job. ``status``: queued, running, cancel_requested, done, failed or cancelled."""

    id: int
    study_name: str
    request: dict[str, Any]
    status: str
    worker: str | None
    progress: dict[str, Any] | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


__all__ = [
    "FINISHED_STATUSES",
    "JOB_STATUSES",
    "RETRYABLE_STATUSES",
    "STUDY_STATUSES",
    "TABLES",
    "TRIAL_STATUSES",
    "VERSION_TABLE",
    "Base",
    "CalibrationRecord",
    "CalibrationRow",
    "DuplicateConfig",
    "JobRow",
    "Store",
    "StoreError",
    "StudyRecord",
    "StudyRow",
    "StudySummary",
    "TrialRecord",
    "TrialRow",
    "WorkloadRecord",
    "WorkloadRow",
    "default_url",
    "migrations_dir",
    "reason_kind",
]

JOB_STATES = (*JOB_STATUSES, "cancel_requested")  # cancel_requested: a running job its worker is stopping
__all__ += ["JOB_STATES", "JobRecord"]
