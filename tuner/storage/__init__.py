"""Storage: the results database (SQLAlchemy 2; SQLite or PostgreSQL), its Alembic migrations (``migrations/``),
records, the job queue and the queries the recommender needs.

Modules: ``tables`` (tables, column types, status enums), ``records`` (the frozen records handed back), ``engine``
(URL, engine, sessions, migrations), ``trials``, ``queue`` (the job queue) and ``queries`` (the recommender's reads),
all joined in ``store``'s :class:`Store`. Import from here, not from those modules.

May import: :mod:`tuner.workload`, :mod:`tuner.errors`, SQLAlchemy, Alembic. Knows nothing of Optuna's internals, Ray
or torch.
"""

from tuner.storage.engine import DEFAULT_DB_FILE, is_disconnect, migrations_dir
from tuner.storage.errors import DatabaseUnavailable, DuplicateConfig, StoreError
from tuner.storage.owners import new_holder, owner_alive, process_owner, release
from tuner.storage.queue import DEFAULT_LEASE_S, MAX_ATTEMPTS
from tuner.storage.records import (
    CalibrationRecord,
    JobRecord,
    MeasuredTrial,
    StudyRecord,
    StudySummary,
    TrialRecord,
    WorkloadRecord,
    reason_kind,
)
from tuner.storage.store import Store
from tuner.storage.tables import (
    FINISHED_STATUSES,
    JOB_FINISHED_STATUSES,
    JOB_STATES,
    JOB_STATUSES,
    RETRYABLE_STATUSES,
    STUDY_STATUSES,
    TABLE_PREFIX,
    TABLES,
    TRIAL_STATUSES,
    VERSION_TABLE,
    Base,
    CalibrationRow,
    JobRow,
    JobStatus,
    StudyRow,
    StudyStatus,
    TrialRow,
    TrialStatus,
    WorkloadRow,
    utcnow,
)
from tuner.storage.trials import STALE_ERROR, TRIAL_ORDERS

__all__ = [
    "DEFAULT_DB_FILE",
    "DEFAULT_LEASE_S",
    "FINISHED_STATUSES",
    "JOB_FINISHED_STATUSES",
    "JOB_STATES",
    "JOB_STATUSES",
    "MAX_ATTEMPTS",
    "RETRYABLE_STATUSES",
    "STALE_ERROR",
    "STUDY_STATUSES",
    "TABLES",
    "TABLE_PREFIX",
    "TRIAL_ORDERS",
    "TRIAL_STATUSES",
    "VERSION_TABLE",
    "Base",
    "CalibrationRecord",
    "CalibrationRow",
    "DatabaseUnavailable",
    "DuplicateConfig",
    "JobRecord",
    "JobRow",
    "JobStatus",
    "MeasuredTrial",
    "Store",
    "StoreError",
    "StudyRecord",
    "StudyRow",
    "StudyStatus",
    "StudySummary",
    "TrialRecord",
    "TrialRow",
    "TrialStatus",
    "WorkloadRecord",
    "WorkloadRow",
    "is_disconnect",
    "migrations_dir",
    "new_holder",
    "owner_alive",
    "process_owner",
    "reason_kind",
    "release",
    "utcnow",
]
