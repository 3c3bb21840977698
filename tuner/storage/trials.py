"""Trials (``dstune_trials``): recording, the pending → running → finished lifecycle, queries and study summaries.

:class:`TrialStore` is a part of :class:`tuner.storage.Store`. A trial's ``number`` is just an integer the caller
chose (the Optuna trial number); the ``config_key`` is unique per study, so one config never runs twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from tuner.storage.engine import Database
from tuner.storage.errors import DuplicateConfig, StoreError
from tuner.storage.owners import owner_alive
from tuner.storage.records import StudyRecord, StudySummary, TrialRecord, as_dict, existing, reason_kind, to_record
from tuner.storage.tables import (
    FINISHED_STATUSES,
    RETRYABLE_STATUSES,
    TRIAL_STATUSES,
    StudyRow,
    TrialLeaseRow,
    TrialRow,
    TrialStatus,
    utcnow,
)

STALE_ERROR = "stale: the process running this trial died (marked failed on resume)"
TRIAL_ORDERS = ("id", "number", "tokens_per_s", "peak_bytes", "estimated_peak_bytes", "created_at", "finished_at")


class TrialStore(Database):
    """The trials of studies: add, start, retry, finish, list, best, summary."""

    def add_trial(
        self,
        study_id: int,
        number: int,
        config_key: str,
        ds_config: dict[str, Any],
        params: dict[str, Any] | None,
        activation_checkpointing: bool,
        estimate: Any,
        status: str = TrialStatus.PENDING,
        prune_reason: str | None = None,
        constraint: float | None = None,
        hardware: str | None = None,
    ) -> int:
        """Record a trial and return its id.

        ``estimate`` is a ``MemoryEstimate`` or its ``to_dict()`` (``per_gpu.total`` becomes ``estimated_peak_bytes``).
        A ``config_key`` the study already has raises :class:`DuplicateConfig` and writes nothing. A pruned trial is
        finished on arrival (``finished_at`` set).
        """
        if status not in TRIAL_STATUSES or status == TrialStatus.RUNNING:
            raise StoreError("status", f"a new trial must be pending or finished, got {status!r}")
        estimate_dict = as_dict(estimate)
        peak = (estimate_dict or {}).get("per_gpu", {}).get("total")
        now = utcnow()
        try:
            with self.session() as session:
                existing(session, StudyRow, study_id, "study")
                row = TrialRow(
                    study_id=study_id,
                    number=number,
                    config_key=config_key,
                    ds_config=ds_config,
                    activation_checkpointing=bool(activation_checkpointing),
                    params=params,
                    estimate=estimate_dict,
                    estimated_peak_bytes=None if peak is None else int(peak),
                    status=str(status),
                    prune_reason=prune_reason,
                    constraint=constraint,
                    hardware=hardware,
                    attempts=0,
                    created_at=now,
                    finished_at=None if status == TrialStatus.PENDING else now,
                )
                session.add(row)
                session.flush()
                return row.id
        except IntegrityError as error:
            found = self.find_trial_by_key(study_id, config_key)
            if found is None:
                raise StoreError("trial", f"cannot insert trial: {error.orig}") from error
            raise DuplicateConfig(study_id, config_key, found.id) from None

    def add_infeasible(
        self,
        study_id: int,
        number: int,
        params: dict[str, Any],
        reason: str,
        hardware: str | None = None,
        config_key: str | None = None,
    ) -> int:
        """Record a pruned trial whose parameters build no ds_config at all (the space rejected them).

        Its ``ds_config`` is empty and its ``config_key`` the one given (the study keys it by its parameters, so a
        repeated proposal is recognised), else ``infeasible:<number>``.
        """
        return self.add_trial(
            study_id,
            number,
            config_key or f"infeasible:{number}",
            {},
            params,
            False,
            None,
            status=TrialStatus.PRUNED,
            prune_reason=reason,
            constraint=1.0,
            hardware=hardware,
        )

    def count_trials(self, study_id: int) -> int:
        """How many trials (distinct configs: one row per config key) the study holds, in every state."""
        with self.session(write=False) as session:
            return session.scalar(sa.select(sa.func.count()).where(TrialRow.study_id == study_id)) or 0

    def find_trial_by_key(self, study_id: int, config_key: str) -> TrialRecord | None:
        """The study's trial with this config key, or None."""
        with self.session(write=False) as session:
            row = session.scalar(
                sa.select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.config_key == config_key)
            )
            return None if row is None else to_record(TrialRecord, row)

    def get_trial(self, trial_id: int) -> TrialRecord:
        """A trial by id (StoreError if missing)."""
        with self.session(write=False) as session:
            return to_record(TrialRecord, existing(session, TrialRow, trial_id, "trial"))

    def start_trial(
        self, trial_id: int, hardware: str | None = None, owner: str | None = None, lease_s: float | None = None
    ) -> TrialRecord:
        """Mark a trial running: ``started_at`` now, ``attempts`` + 1, earlier results cleared; held by ``owner``
        (:func:`~tuner.storage.owners.process_owner`) for ``lease_s`` seconds (renewed by
        :meth:`renew_trial_leases`).

        Allowed from pending and from the retryable failures (failed, error, timeout); otherwise StoreError (so of two
        processes starting one trial, one gets the error).
        """
        with self.session() as session:
            row = existing(session, TrialRow, trial_id, "trial", with_for_update=True)
            if row.status not in RETRYABLE_STATUSES:
                raise StoreError("status", f"trial {trial_id} is {row.status}; cannot start it")
            row.status = TrialStatus.RUNNING
            row.attempts += 1
            row.started_at = now = utcnow()
            row.finished_at = row.duration_s = row.measurement = row.tokens_per_s = row.peak_bytes = row.error = None
            if owner is not None:
                expires = None if lease_s is None else now + timedelta(seconds=lease_s)
                session.merge(TrialLeaseRow(trial_id=trial_id, owner=owner, lease_expires_at=expires))
            if hardware is not None:
                row.hardware = hardware
            session.flush()
            return to_record(TrialRecord, row)

    def renew_trial_leases(self, trial_ids: Iterable[int], owner: str, lease_s: float) -> int:
        """Extend ``owner``'s leases on its running trials to ``lease_s`` seconds from now; returns how many it
        holds."""
        ids = list(trial_ids)
        if not ids:
            return 0
        with self.session() as session:
            result = session.execute(
                sa.update(TrialLeaseRow)
                .where(TrialLeaseRow.trial_id.in_(ids), TrialLeaseRow.owner == owner)
                .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
                .execution_options(synchronize_session=False)
            )
            return int(cast(sa.CursorResult[Any], result).rowcount)

    def retry_trial(self, trial_id: int, number: int) -> TrialRecord:
        """Make a failed (or error/timeout) trial pending again under a new Optuna trial ``number``.

        The config is not run twice by accident: only the retryable statuses may be retried, and ``attempts`` keeps
        counting (:meth:`start_trial` increments it).
        """
        with self.session() as session:
            row = existing(session, TrialRow, trial_id, "trial")
            if row.status not in RETRYABLE_STATUSES or row.status == TrialStatus.RUNNING:
                raise StoreError("status", f"trial {trial_id} is {row.status}; cannot retry it")
            row.number = number
            row.status = TrialStatus.PENDING
            row.started_at = row.finished_at = row.duration_s = None
            row.measurement = row.tokens_per_s = row.peak_bytes = row.error = None
            session.flush()
            return to_record(TrialRecord, row)

    def finish_trial(
        self, trial_id: int, status: str, measurement: Any = None, error: str | None = None
    ) -> TrialRecord:
        """Record a trial's outcome (``measurement`` is a ``Measurement`` or its ``to_dict()``).

        Fills ``tokens_per_s``, ``peak_bytes`` (the max over ``peak_bytes_per_rank``), ``error`` (the argument, else
        the measurement's), ``finished_at`` and ``duration_s`` (since ``started_at``). Allowed from pending or running.
        """
        if status not in FINISHED_STATUSES:
            raise StoreError("status", f"must be one of {', '.join(FINISHED_STATUSES)}, got {status!r}")
        data = as_dict(measurement)
        with self.session() as session:
            row = existing(session, TrialRow, trial_id, "trial")
            if row.status not in (TrialStatus.PENDING, TrialStatus.RUNNING):
                raise StoreError("status", f"trial {trial_id} is already {row.status}")
            now = utcnow()
            row.status = str(status)
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
            return to_record(TrialRecord, row)

    def record_confirmation(self, trial_id: int, confirmation: dict[str, Any]) -> TrialRecord:
        """Keep what an independent run of a measured trial's config measured (:mod:`tuner.study.confirm`) under its
        measurement's ``confirmation`` key; the trial's own figures stay as they were."""
        with self.session() as session:
            row = existing(session, TrialRow, trial_id, "trial")
            if row.status != TrialStatus.OK:
                raise StoreError("status", f"trial {trial_id} is {row.status}, not a measured trial to confirm")
            row.measurement = {**(row.measurement or {}), "confirmation": dict(confirmation)}
            session.flush()
            return to_record(TrialRecord, row)

    def mark_stale_running_failed(self, study_id: int, older_than: timedelta | None = None) -> list[int]:
        """Mark the study's running trials that nobody holds failed (their process died); returns their ids.

        Call on resume, before dispatching: a trial left running by a killed process would otherwise stay running
        forever. A trial is held while its ``owner`` process lives (same host) or its lease has not passed (another
        host); trials of another live process on the same study are left alone. Trials without an owner (started
        before leases existed) count as stale. ``older_than`` spares trials started more recently than that.
        """
        with self.session() as session:
            query = sa.select(TrialRow).where(TrialRow.study_id == study_id, TrialRow.status == TrialStatus.RUNNING)
            if older_than is not None:
                query = query.where(TrialRow.started_at < utcnow() - older_than)
            rows = list(session.scalars(query.order_by(TrialRow.id).with_for_update()))
            now = utcnow()
            leases = {
                lease.trial_id: lease
                for lease in session.scalars(
                    sa.select(TrialLeaseRow).where(TrialLeaseRow.trial_id.in_([row.id for row in rows]))
                )
            }
            stale = [row for row in rows if not _held(leases.get(row.id), now)]
            for row in stale:
                row.status = TrialStatus.FAILED
                row.error = STALE_ERROR
                row.finished_at = now
            return [row.id for row in stale]

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
            return [to_record(TrialRecord, row) for row in session.scalars(query)]

    def best_trial(self, study_id: int) -> TrialRecord | None:
        """The ok trial with the highest ``tokens_per_s`` (the earliest on a tie), or None."""
        best = self.trials(study_id, status=TrialStatus.OK, order_by="-tokens_per_s", limit=1)
        return best[0] if best and best[0].tokens_per_s is not None else None

    def study_summary(self, study_id: int) -> StudySummary:
        """Counts by status and the histogram of pruned reasons (by :func:`reason_kind`)."""
        with self.session(write=False) as session:
            study = to_record(StudyRecord, existing(session, StudyRow, study_id, "study"))
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
                .where(TrialRow.study_id == study_id, TrialRow.status == TrialStatus.PRUNED)
                .group_by(TrialRow.prune_reason)
            ):
                kind = reason_kind(reason) if reason else "(no reason)"
                reasons[kind] = reasons.get(kind, 0) + count
        ordered = dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0])))
        return StudySummary(study, sum(counts.values()), counts, ordered, self.best_trial(study_id))


def _held(lease: TrialLeaseRow | None, now: datetime) -> bool:
    """True while the trial's holder lives (this host) or, elsewhere, its lease has not passed."""
    if lease is None:
        return False
    alive = owner_alive(lease.owner)
    if alive is not None:
        return alive
    return lease.lease_expires_at is not None and lease.lease_expires_at >= now


__all__ = ["STALE_ERROR", "TRIAL_ORDERS", "TrialStore"]
