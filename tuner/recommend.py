"""The recommender: the best ds_config for a workload, from measurements when there are any, else from the estimator.

Three sources, tried in order; the answer always says which (``source``):

1. ``measured``: the workload (model, cluster, sequence length, precision, attention; micro-batch, accumulation and
   checkpointing are what is recommended, so they are ignored) has measured trials: the ok trial with the highest
   tokens/s over all its studies.
2. ``nearest``: no measurement of this workload, but of the same model (family and parameter count) on another
   cluster or sequence length: the best ok trials of those workloads (:data:`NEAREST_PER_WORKLOAD` per workload, at
   most :data:`NEAREST_WORKLOADS` workloads) are re-checked by the estimator against the requested workload with the
   calibrated margin; the fastest that fits wins. Its throughput was measured on the other workload (``measured_on``).
3. ``estimate``: the estimator alone over the default search space's ZeRO stage × micro-batch × activation
   checkpointing grid. Heuristic, documented and deterministic: the lowest ZeRO stage (least communication), then no
   checkpointing before checkpointing (no recomputation), then the largest micro-batch, that fits with the margin.

Cost: a handful of indexed queries (the workload's fingerprint is unique; trials are found by ``study_id`` and
``status``), never all trials loaded; the estimator grid is cached per workload and margin.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Literal

import sqlalchemy as sa

from tuner.estimator import ConfigError, MemoryEstimate, estimate
from tuner.space import InfeasibleConfig, default_space_path, load_space
from tuner.storage import Store, StudyRow, TrialRow, WorkloadRow
from tuner.study.calibration import Calibration
from tuner.workload import Workload

Source = Literal["measured", "nearest", "estimate"]
NEAREST_WORKLOADS = 10
NEAREST_PER_WORKLOAD = 3
GRID = ("stage", "micro_batch", "activation_checkpointing")


class NoFeasibleConfig(Exception):
    """Nothing measured applies and no config of the default space fits the workload."""


@dataclass(frozen=True)
class Recommendation:
    """What to train with and why. ``peak_bytes`` is measured (None for ``estimate``); ``estimated_peak_bytes`` is
    the estimator's peak per GPU for the requested workload."""

    source: Source
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    tokens_per_s: float | None
    peak_bytes: int | None
    estimated_peak_bytes: int | None
    trial_id: int | None
    study: str | None
    workload_fingerprint: str
    measured_on: str | None
    margin: float


def normalised(workload: Workload) -> Workload:
    """The workload as studies store it: micro-batch 1, accumulation 1, no checkpointing (the search decides those)."""
    return replace(workload, train=replace(workload.train, micro_batch=1, grad_accum=1, activation_checkpointing=False))


def hardware_of(workload: Workload) -> str:
    """The calibration key of the workload's device (as :class:`tuner.study.TuningStudy` records it)."""
    return "cpu" if workload.cluster.device == "cpu" else f"cuda:{workload.cluster.gpu_memory}"


def recommend(store: Store, workload: Workload) -> Recommendation:
    """The best config for ``workload``: measured, else nearest re-checked, else estimated (module docstring)."""
    workload = normalised(workload)
    fingerprint = workload.fingerprint()
    calibration = store.get_calibration(hardware_of(workload), workload.model.family)
    margin = calibration.margin if calibration is not None else Calibration().margin
    found = _measured(store, fingerprint)
    if found is not None:
        trial, study = found
        return Recommendation(
            "measured",
            trial.ds_config,
            trial.activation_checkpointing,
            trial.tokens_per_s,
            trial.peak_bytes,
            trial.estimated_peak_bytes,
            trial.id,
            study,
            fingerprint,
            fingerprint,
            margin,
        )
    nearest = _nearest(store, workload, fingerprint, margin)
    if nearest is not None:
        return nearest
    return _estimated(workload, fingerprint, margin)


def _measured(store: Store, fingerprint: str) -> tuple[Any, str] | None:
    with store.session(write=False) as session:
        workload_id = session.scalar(sa.select(WorkloadRow.id).where(WorkloadRow.fingerprint == fingerprint))
        if workload_id is None:
            return None
        row = session.execute(_best_trials([workload_id], 1)).first()
        return None if row is None else (row[0], row[1])


def _best_trials(workload_ids: list[int], per_study: int) -> sa.Select[Any]:
    studies = sa.select(StudyRow.id).where(StudyRow.workload_id.in_(workload_ids)).scalar_subquery()
    return (
        sa.select(TrialRow, StudyRow.name, StudyRow.workload_id)
        .join(StudyRow, StudyRow.id == TrialRow.study_id)
        .where(TrialRow.study_id.in_(studies), TrialRow.status == "ok", TrialRow.tokens_per_s.is_not(None))
        .order_by(TrialRow.tokens_per_s.desc(), TrialRow.id)
        .limit(per_study)
    )


def _nearest(store: Store, workload: Workload, fingerprint: str, margin: float) -> Recommendation | None:
    calibration = Calibration(margin=margin)
    with store.session(write=False) as session:
        others = sa.select(WorkloadRow.id).where(
            WorkloadRow.model_family == workload.model.family,
            WorkloadRow.n_params == workload.model.n_params,
            WorkloadRow.fingerprint != fingerprint,
        )
        others = others.order_by(WorkloadRow.id.desc()).limit(NEAREST_WORKLOADS).scalar_subquery()
        rank = (
            sa.func.row_number()
            .over(partition_by=StudyRow.workload_id, order_by=(TrialRow.tokens_per_s.desc(), TrialRow.id))
            .label("rank")
        )
        ranked = (  # the window runs over narrow index-backed columns; the JSON is read for the winners only
            sa.select(TrialRow.id, rank)
            .join(StudyRow, StudyRow.id == TrialRow.study_id)
            .where(StudyRow.workload_id.in_(others), TrialRow.status == "ok", TrialRow.tokens_per_s.is_not(None))
            .subquery()
        )
        candidates = session.execute(
            sa.select(
                TrialRow.id,
                TrialRow.ds_config,
                TrialRow.activation_checkpointing,
                TrialRow.tokens_per_s,
                TrialRow.peak_bytes,
                StudyRow.name.label("study"),
                WorkloadRow.fingerprint,
            )
            .join(ranked, ranked.c.id == TrialRow.id)
            .join(StudyRow, StudyRow.id == TrialRow.study_id)
            .join(WorkloadRow, WorkloadRow.id == StudyRow.workload_id)
            .where(ranked.c.rank <= NEAREST_PER_WORKLOAD)
            .order_by(TrialRow.tokens_per_s.desc(), TrialRow.id)
        ).all()
    for row in candidates:
        checked = _recheck(workload, row.ds_config, row.activation_checkpointing, calibration)
        if checked is None:
            continue
        config, est = checked
        return Recommendation(
            "nearest",
            config,
            row.activation_checkpointing,
            row.tokens_per_s,
            row.peak_bytes,
            est.gpu_total,
            row.id,
            row.study,
            fingerprint,
            row.fingerprint,
            margin,
        )
    return None


def _recheck(
    workload: Workload, ds_config: dict[str, Any], checkpointing: bool, calibration: Calibration
) -> tuple[dict[str, Any], MemoryEstimate] | None:
    """The measured config adapted to ``workload`` (its global batch follows the world size) and its estimate, when
    it fits with the margin; else None."""
    config = {key: value for key, value in ds_config.items() if key != "train_batch_size"}
    micro = config.get("train_micro_batch_size_per_gpu", 1)
    accum = config.get("gradient_accumulation_steps", 1)
    if not (isinstance(micro, int) and isinstance(accum, int)) or micro < 1 or accum < 1:
        return None
    config["train_batch_size"] = micro * accum * workload.cluster.world_size
    trial_workload = replace(
        workload,
        train=replace(workload.train, micro_batch=micro, grad_accum=accum, activation_checkpointing=checkpointing),
    )
    try:
        est = estimate(trial_workload, config)
    except (ConfigError, ValueError, TypeError, ArithmeticError):
        return None
    if not (calibration.fits(est.gpu_total, est.gpu_memory) and est.cpu_headroom >= 0):
        return None
    return config, est


@functools.cache
def _grid_space() -> Any:
    return load_space(default_space_path()).restricted(list(GRID))


class _Fixed:
    """A trial that answers with fixed values (the :class:`tuner.space.TrialLike` protocol)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return self.params[name]

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return self.params[name]


def _estimated(workload: Workload, fingerprint: str, margin: float) -> Recommendation:
    found = _estimated_cached(workload, margin)
    if found is None:
        raise NoFeasibleConfig(
            f"no config of the default search space (stage × micro-batch × checkpointing) fits {workload.model.name} "
            f"on {workload.cluster.world_size} × {workload.cluster.gpu_memory} B with margin {margin:.3f}"
        )
    config, checkpointing, peak = found
    return Recommendation("estimate", config, checkpointing, None, None, peak, None, None, fingerprint, None, margin)


@functools.lru_cache(maxsize=1024)
def _estimated_cached(workload: Workload, margin: float) -> tuple[dict[str, Any], bool, int] | None:
    space = _grid_space()
    grid = space.grid(list(GRID), world_size=workload.cluster.world_size)
    calibration = Calibration(margin=margin)
    for stage in sorted(grid["stage"]):
        for checkpointing in sorted(grid["activation_checkpointing"]):
            for micro in sorted(grid["micro_batch"], reverse=True):
                params = {"stage": stage, "micro_batch": micro, "activation_checkpointing": checkpointing}
                try:
                    suggestion = space.suggest(_Fixed(params), workload)
                    est = estimate(suggestion.apply_to(workload), suggestion.ds_config)
                except (InfeasibleConfig, ConfigError):
                    continue
                if calibration.fits(est.gpu_total, est.gpu_memory) and est.cpu_headroom >= 0:
                    return suggestion.ds_config, suggestion.activation_checkpointing, est.gpu_total
    return None


__all__ = ["NoFeasibleConfig", "Recommendation", "hardware_of", "normalised", "recommend"]
