"""The tables: declarative base, one row class per table, the column types, and the status names.

Every table is prefixed ``dstune_`` and Alembic keeps its revision in ``dstune_alembic_version``, so Optuna's
``RDBStorage`` may share the database. Changing a row class here needs a migration in ``migrations/versions``.

Statuses are :class:`enum.StrEnum` members: they equal (and hash as) their strings, which is what the database holds,
and the tuples below (plain strings, in declaration order) are derived from them.

Example:
    >>> TrialStatus.OK == "ok" and "ok" in FINISHED_STATUSES
    True
    >>> RETRYABLE_STATUSES
    ('pending', 'failed', 'error', 'timeout')
    >>> JOB_STATES[-1]
    'cancel_requested'
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TABLE_PREFIX = "dstune_"
VERSION_TABLE = "dstune_alembic_version"


class TrialStatus(enum.StrEnum):
    """Where a trial stands: ``pending`` and ``running``, then one of the finished statuses."""

    PENDING = "pending"
    RUNNING = "running"
    PRUNED = "pruned"
    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    INVALID_CONFIG = "invalid_config"
    FAILED = "failed"
    DIVERGED = "diverged"  # measured, but its step-0 loss or gradient norm left the reference's (tuner.study)


class StudyStatus(enum.StrEnum):
    """Where a study stands."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class JobStatus(enum.StrEnum):
    """Where a queued job stands; ``cancel_requested`` is a running job its worker is stopping."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"


def _values(*members: enum.StrEnum) -> tuple[str, ...]:
    return tuple(member.value for member in members)


TRIAL_STATUSES = _values(*TrialStatus)
FINISHED_STATUSES = _values(*(s for s in TrialStatus if s not in (TrialStatus.PENDING, TrialStatus.RUNNING)))
RETRYABLE_STATUSES = _values(  # start_trial accepts these
    TrialStatus.PENDING, TrialStatus.FAILED, TrialStatus.ERROR, TrialStatus.TIMEOUT
)
STUDY_STATUSES = _values(*StudyStatus)
JOB_STATUSES = _values(*(s for s in JobStatus if s is not JobStatus.CANCEL_REQUESTED))
JOB_STATES = _values(*JobStatus)  # every status a job row may hold
JOB_FINISHED_STATUSES = _values(JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (what every timestamp column holds)."""
    return datetime.now(timezone.utc)


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
    status: Mapped[str] = mapped_column(sa.String(16), default=StudyStatus.CREATED.value)
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


class TrialLeaseRow(Base):
    """Who runs a running trial (a holder of :mod:`tuner.storage.owners`) and until when its lease holds, apart from
    the trial row. Only a running trial's lease means anything; one left behind by a finished trial is inert."""

    __tablename__ = "dstune_trial_leases"

    trial_id: Mapped[int] = mapped_column(sa.ForeignKey("dstune_trials.id", ondelete="CASCADE"), primary_key=True)
    owner: Mapped[str] = mapped_column(sa.String(255))
    lease_expires_at: Mapped[datetime | None]


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
    """A queued tuning request (for the job queue of the API server and workers). A running job is leased to its
    ``worker`` until ``lease_expires_at``, which the worker's heartbeat renews; ``attempts`` counts its claims."""

    __tablename__ = "dstune_jobs"
    __table_args__ = (
        sa.Index("ix_dstune_jobs_status_created_at", "status", "created_at"),
        sa.Index("ix_dstune_jobs_status_lease_expires_at", "status", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    study_name: Mapped[str] = mapped_column(sa.String(255), index=True)
    request: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(sa.String(16), default=JobStatus.QUEUED.value)
    worker: Mapped[str | None] = mapped_column(sa.String(255))
    progress: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")


TABLES = tuple(sorted(Base.metadata.tables))

__all__ = [
    "FINISHED_STATUSES",
    "JOB_FINISHED_STATUSES",
    "JOB_STATES",
    "JOB_STATUSES",
    "RETRYABLE_STATUSES",
    "STUDY_STATUSES",
    "TABLES",
    "TABLE_PREFIX",
    "TRIAL_STATUSES",
    "VERSION_TABLE",
    "Base",
    "CalibrationRow",
    "JobRow",
    "JobStatus",
    "StudyRow",
    "StudyStatus",
    "TrialLeaseRow",
    "TrialRow",
    "TrialStatus",
    "UTCDateTime",
    "WorkloadRow",
    "utcnow",
]
