"""What the store hands back: frozen dataclasses copied out of the session, never ORM rows.

A record stays readable after its session closed, after the store closed and across threads. Statuses in records are
plain strings (as stored), whatever the caller passed in.

Example:
    >>> from tuner.storage.tables import CalibrationRow, utcnow
    >>> row = CalibrationRow(id=1, hardware="cpu", model_family="gpt2", margin=0.1, samples=3, updated_at=utcnow())
    >>> to_record(CalibrationRecord, row).margin
    0.1
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from tuner.storage.errors import StoreError
from tuner.storage.tables import Base
from tuner.workload import TrialConfig

R = TypeVar("R")
RowT = TypeVar("RowT", bound=Base)


@dataclass(frozen=True)
class WorkloadRecord:
    """A stored workload (``workload`` is :func:`tuner.workload.workload_to_dict`'s output)."""

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

    @property
    def trial(self) -> TrialConfig:
        """What the trial trained with (its ``ds_config`` and ``activation_checkpointing`` columns)."""
        return TrialConfig(self.ds_config, self.activation_checkpointing)


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
class JobRecord:
    """A queued tuning job. ``status``: queued, running, cancel_requested, done, failed or cancelled. A running job
    is leased to ``worker`` until ``lease_expires_at`` (renewed at ``heartbeat_at``); ``attempts`` counts claims."""

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
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    attempts: int = 0


@dataclass(frozen=True)
class StudySummary:
    """Trial counts by status (every status present, zeros included), pruned reasons and the best trial."""

    study: StudyRecord
    total: int
    counts: dict[str, int]
    pruned_reasons: dict[str, int]
    best: TrialRecord | None


@dataclass(frozen=True)
class MeasuredTrial:
    """A measured ok trial as the recommender reads it: the config, its throughput and peak, and where it ran
    (``study`` by name, ``workload_fingerprint`` the workload that study searched)."""

    trial_id: int
    study: str
    workload_fingerprint: str
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    tokens_per_s: float
    peak_bytes: int | None
    estimated_peak_bytes: int | None
    number: int  # the trial's number in its study (from 0), as the CLI and the dashboard show it

    @property
    def trial(self) -> TrialConfig:
        """What the trial trained with (its ``ds_config`` and ``activation_checkpointing`` columns)."""
        return TrialConfig(self.ds_config, self.activation_checkpointing)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def to_record(cls: type[R], row: Base) -> R:
    """The record ``cls`` with the row's values of the same names (enum members as their plain values)."""
    return cls(**{f.name: _plain(getattr(row, f.name)) for f in fields(cls)})  # type: ignore[arg-type]


def existing(session: Session, model: type[RowT], row_id: int, what: str, **options: Any) -> RowT:
    """The ``model`` row with primary key ``row_id`` (``options`` go to ``Session.get``, e.g. ``with_for_update``);
    a missing one is a :class:`StoreError` on the field ``{what}_id``."""
    row = session.get(model, row_id, **options)
    if row is None:
        raise StoreError(f"{what}_id", f"no {what} {row_id}")
    return row


def as_dict(value: Any) -> dict[str, Any] | None:
    """``value`` if None or a dict, else its ``to_dict()`` (a ``Measurement``, a ``MemoryEstimate``)."""
    if value is None or isinstance(value, dict):
        return value
    to_dict = getattr(value, "to_dict", None)
    if to_dict is None:
        raise StoreError("value", f"expected a dict or an object with to_dict(), got {type(value).__name__}")
    return to_dict()


# What a reason measured, which differs from trial to trial of one kind: sizes and byte counts, percentages, figures
# grouped by thousands (11,285 tokens/s) and the trial a reason refers to. Other numbers are the config's and the
# conditions' own operands (a pin's value, ``trainable_params >= 1000000000``, a global batch): they stay.
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][+-]?\d+)?"
_UNIT = r"(?=\s?(?:B|bytes|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b|%)"
_MEASURED = re.compile(rf"{_NUMBER}{_UNIT}|(?<=trial ){_NUMBER}|\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?")


def reason_kind(reason: str) -> str:
    """A prune reason with what it measured replaced by ``N`` (sizes, byte counts, percentages, the trial it names),
    so reasons of one kind share a histogram bucket; a condition's operands and the config's values stay as written.

    Example:
        >>> reason_kind("GPU memory short by 1073741824 bytes at the backward phase (largest category: activations)")
        'GPU memory short by N bytes at the backward phase (largest category: activations)'
        >>> reason_kind("needs 1.97 GiB of 64.0 MiB GPU memory (5% margin included); largest: buffers 1.00 GiB")
        'needs N GiB of N MiB GPU memory (N% margin included); largest: buffers N GiB'
        >>> reason_kind("tensor_parallel is pinned to 2, which applies only when trainable_params >= 1000000000")
        'tensor_parallel is pinned to 2, which applies only when trainable_params >= 1000000000'
    """
    return _MEASURED.sub("N", reason)


__all__ = [
    "CalibrationRecord",
    "JobRecord",
    "MeasuredTrial",
    "StudyRecord",
    "StudySummary",
    "TrialRecord",
    "WorkloadRecord",
    "as_dict",
    "existing",
    "reason_kind",
    "to_record",
]
