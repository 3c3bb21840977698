"""The reads the recommender needs (:mod:`tuner.recommend`): the best measured configs of a workload, or of the
workloads of the same model. A handful of indexed queries; never all trials loaded.

:class:`RecommenderQueries` is a part of :class:`tuner.storage.Store`; both methods answer :class:`MeasuredTrial`
records (ok trials with a throughput only), fastest first, the earliest trial first on a tie.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tuner.storage.engine import Database
from tuner.storage.records import MeasuredTrial
from tuner.storage.tables import StudyRow, TrialRow, TrialStatus, WorkloadRow

_COLUMNS = (  # in the field order of MeasuredTrial
    TrialRow.id,
    StudyRow.name,
    WorkloadRow.fingerprint,
    TrialRow.ds_config,
    TrialRow.activation_checkpointing,
    TrialRow.tokens_per_s,
    TrialRow.peak_bytes,
    TrialRow.estimated_peak_bytes,
    TrialRow.number,
)


def _measured(row: Any) -> MeasuredTrial:
    return MeasuredTrial(*row)


def _ok() -> tuple[sa.ColumnElement[bool], ...]:
    return TrialRow.status == TrialStatus.OK, TrialRow.tokens_per_s.is_not(None)


class RecommenderQueries(Database):
    """Measured ok trials by workload, for the recommender."""

    def best_measured_trial(self, fingerprint: str) -> MeasuredTrial | None:
        """The fastest ok trial over every study of the workload with this fingerprint, or None."""
        best = self.best_measured_trials(fingerprint, 1)
        return best[0] if best else None

    def best_measured_trials(self, fingerprint: str, limit: int) -> list[MeasuredTrial]:
        """The ``limit`` fastest ok trials over every study of the workload with this fingerprint, fastest first.

        Two indexed lookups: the workload by its unique fingerprint, then the trials by (study, status, tokens/s).
        """
        with self.session(write=False) as session:
            workload_id = session.scalar(sa.select(WorkloadRow.id).where(WorkloadRow.fingerprint == fingerprint))
            if workload_id is None:
                return []
            studies = sa.select(StudyRow.id).where(StudyRow.workload_id == workload_id).scalar_subquery()
            rows = session.execute(
                sa.select(*_COLUMNS)
                .join(StudyRow, StudyRow.id == TrialRow.study_id)
                .join(WorkloadRow, WorkloadRow.id == StudyRow.workload_id)
                .where(TrialRow.study_id.in_(studies), *_ok())
                .order_by(TrialRow.tokens_per_s.desc(), TrialRow.id)
                .limit(limit)
            ).all()
            return [_measured(row) for row in rows]

    def nearest_measured_trials(
        self, model_family: str, n_params: int, exclude_fingerprint: str, *, workloads: int, per_workload: int
    ) -> list[MeasuredTrial]:
        """The best ``per_workload`` ok trials of each of the newest ``workloads`` other workloads of the same model
        (family and parameter count; the workload ``exclude_fingerprint`` left out), fastest first."""
        with self.session(write=False) as session:
            others = (
                sa.select(WorkloadRow.id)
                .where(
                    WorkloadRow.model_family == model_family,
                    WorkloadRow.n_params == n_params,
                    WorkloadRow.fingerprint != exclude_fingerprint,
                )
                .order_by(WorkloadRow.id.desc())
                .limit(workloads)
                .scalar_subquery()
            )
            rank = (
                sa.func.row_number()
                .over(partition_by=StudyRow.workload_id, order_by=(TrialRow.tokens_per_s.desc(), TrialRow.id))
                .label("rank")
            )
            ranked = (  # the window runs over narrow index-backed columns; the JSON is read for the winners only
                sa.select(TrialRow.id, rank)
                .join(StudyRow, StudyRow.id == TrialRow.study_id)
                .where(StudyRow.workload_id.in_(others), *_ok())
                .subquery()
            )
            rows = session.execute(
                sa.select(*_COLUMNS)
                .join(ranked, ranked.c.id == TrialRow.id)
                .join(StudyRow, StudyRow.id == TrialRow.study_id)
                .join(WorkloadRow, WorkloadRow.id == StudyRow.workload_id)
                .where(ranked.c.rank <= per_workload)
                .order_by(TrialRow.tokens_per_s.desc(), TrialRow.id)
            ).all()
            return [_measured(row) for row in rows]


__all__ = ["RecommenderQueries"]
