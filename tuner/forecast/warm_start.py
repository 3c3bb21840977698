"""Warm starts from the throughput model: which configs a study measures first, and which next.

* :func:`rank_feasible`: every config of a space's coarse grid (ZeRO stage, micro-batch, accumulation, checkpointing,
  offload; everything else at its default) that fits by the estimator with the calibrated margin, fastest predicted
  first (:func:`tuner.estimator.throughput.prediction.predict` with the fitted factors).
* :func:`params_of`: the space's parameter values that reproduce a stored trial config, so an earlier study's best
  config can be enqueued (``optuna.Study.enqueue_trial``) into a new study and re-checked by the estimator there.
* :class:`ThroughputGuide`: the few calls the tuning loop makes. ``warm_start()`` gives the trials to enqueue first
  (earlier similar studies' best configs that still fit, then the model's best), ``after_run()`` refits the constants
  from a measured run, and ``next_pick()``, asked when no enqueued trial is waiting, names the config the refitted
  model ranks within its error of the best measured so far (or None: the sampler proposes).

Example:
    >>> from tuner.space import default_space_path, load_space
    >>> from tuner.forecast.calibration import Calibration
    >>> from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model
    >>> work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=1024))
    >>> guide = ThroughputGuide(load_space(default_space_path()), work, Calibration(), global_batch=256)
    >>> [(p["stage"], p["micro_batch"], p["activation_checkpointing"]) for p in guide.warm_start(2)]
    [(1, 32, False), (1, 16, False)]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.estimator import ConfigError, MemoryEstimate, StepTerms, ThroughputPrediction, estimate, predict
from tuner.forecast.calibration import Calibration
from tuner.forecast.throughput_fit import ThroughputFit, load_fit, record_run
from tuner.space import InfeasibleConfig, SearchSpace, Suggestion
from tuner.workload import TrialConfig, Workload
from tuner.workload.layouts import LAYOUTS

COARSE = (
    "stage",
    "micro_batch",
    "grad_accum",
    "activation_checkpointing",
    "offload_optimizer",
    "offload_param",
    "threads_per_rank",  # searched only with tune --search-threads
)
# When nothing of the coarse grid fits (a sequence too long for data parallelism), the guide ranks the grid of the
# memory savers instead: ZeRO stage, checkpointing and offload at the space's default micro-batch (1, the least
# memory), with Ulysses and ALST's tiling and checkpoint offload where the space offers them (long sequences of
# transformers models) and bf16 master weights and the chunked loss where the study allows them, so that a study that
# fits only with them starts from them rather than from random draws.
# (Ulysses and ALST in the coarse grid itself would make an 8B model's grid at 4K tokens on 8 GPUs 140,000 configs.)
LONG_CONTEXT = (
    *(kind.field for kind in LAYOUTS if kind.memory_saver),
    "tiled_mlp_shards",
    "tiled_loss_shards",
    "offload_checkpoints",
)
NUMERICS_SAVERS = ("bf16_master_weights", "bf16_optimizer_states", "chunked_loss")
SAVERS = ("stage", "activation_checkpointing", "offload_optimizer", "offload_param", *LONG_CONTEXT, *NUMERICS_SAVERS)
WARM_START = 3  # configs measured first
FROM_EARLIER = 2  # of which at most this many are earlier studies' best
MIN_TOLERANCE = 0.05  # a pick predicted at least 95 % of the best measured is still worth a run


@dataclass(frozen=True)
class Ranked:
    """A feasible config with its memory estimate and predicted throughput; ``params`` go to ``enqueue_trial``."""

    suggestion: Suggestion
    estimate: MemoryEstimate
    prediction: ThroughputPrediction
    params: dict[str, Any]

    @property
    def terms(self) -> StepTerms:
        """The prediction's step terms at the table's rates (refits re-weigh them without re-predicting)."""
        return self.prediction.terms


class _Fixed:
    """A trial answering from ``values``, else with each parameter's default (the TrialLike protocol)."""

    def __init__(self, values: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
        self.values, self.defaults = values, defaults

    def _answer(self, name: str) -> Any:
        return self.values.get(name, self.defaults[name])

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        value = self._answer(name)
        if value not in choices:  # Optuna would refuse it when the config is enqueued: this study does not offer it
            raise InfeasibleConfig(f"{name} {value!r} is not among the choices offered here {tuple(choices)}")
        return value

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return self._answer(name)

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return self._answer(name)


def _defaults(space: SearchSpace) -> dict[str, Any]:
    return {p.name: p.searchable_default() for p in space.parameters}  # what enqueue_trial can carry


def _suggest(
    space: SearchSpace, values: Mapping[str, Any], workload: Workload, global_batch: int | None, nvme: str | None
) -> Suggestion | None:
    """The suggestion for ``values`` (None when the space refuses it)."""
    try:
        return space.suggest(_Fixed(values, _defaults(space)), workload, global_batch, nvme)
    except (InfeasibleConfig, ConfigError):
        return None


def _judge(
    suggestion: Suggestion, workload: Workload, calibration: Calibration, fit: ThroughputFit
) -> tuple[MemoryEstimate, ThroughputPrediction] | None:
    """The estimate and prediction when the config fits with the margin; else None."""
    try:
        est = estimate(workload, suggestion.trial)
    except ConfigError:
        return None
    if not (calibration.fits(est.gpu_total, est.gpu_memory) and est.cpu_headroom >= 0):
        return None
    return est, predict(workload, suggestion.trial, fit.factors)


def grid_suggestions(
    space: SearchSpace,
    workload: Workload,
    names: Iterable[str] = COARSE,
    global_batch: int | None = None,
    nvme_path: str | None = None,
) -> Iterator[Suggestion]:
    """The distinct configs of the grid over ``names`` (those the space searches; everything else at its default),
    in grid order (the order of their first point in the product of the grid's value lists). The space's own
    conditions and layout checks decide what applies: a parameter that does not apply (hpZ below ZeRO-3, AutoTP on
    a small model, Ulysses at a short sequence) is never branched on, one the workload cannot run is refused by the
    space.

    The grid is walked as the space's decision tree (:func:`_walk`): the space asks for its parameters in order, and
    only a grid parameter it asks for branches, so the cost follows the configs that exist, not the product of every
    list (a long-context grid of 13 parameters at a short sequence is the 7-parameter grid's cost).
    """
    names = [name for name in names if name in space.searched]
    grid = space.grid(names, global_batch=global_batch, world_size=workload.cluster.world_size, nvme_path=nvme_path)
    leaves = list(_walk(space, grid, {}, workload, global_batch, nvme_path, _defaults(space)))
    leaves.sort(key=lambda leaf: tuple(grid[name].index(leaf[0][name]) if name in leaf[0] else 0 for name in grid))
    seen: set[str] = set()
    for _, suggestion in leaves:
        if suggestion.key not in seen:
            seen.add(suggestion.key)
            yield suggestion


class _Branch(Exception):
    """The space asked for a grid parameter the walk has not fixed yet."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Walking(_Fixed):
    """A trial answering the grid parameters fixed so far; asked for another grid parameter, it branches."""

    def __init__(self, grid: Mapping[str, list[Any]], fixed: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
        super().__init__(fixed, defaults)
        self.grid = grid

    def _answer(self, name: str) -> Any:
        if name in self.grid and name not in self.values:
            raise _Branch(name)
        return super()._answer(name)


def _walk(
    space: SearchSpace,
    grid: Mapping[str, list[Any]],
    fixed: dict[str, Any],
    workload: Workload,
    global_batch: int | None,
    nvme: str | None,
    defaults: Mapping[str, Any],
) -> Iterator[tuple[dict[str, Any], Suggestion]]:
    """Every config the space makes from ``fixed`` and the grid values of the parameters it asks for next, with the
    grid values it used."""
    trial = _Walking(grid, fixed, defaults)
    try:
        suggestion = space.suggest(trial, workload, global_batch, nvme)
    except _Branch as branch:
        for value in grid[branch.name]:
            yield from _walk(space, grid, {**fixed, branch.name: value}, workload, global_batch, nvme, defaults)
        return
    except (InfeasibleConfig, ConfigError):
        return
    yield fixed, suggestion


def rank_feasible(
    space: SearchSpace,
    workload: Workload,
    calibration: Calibration,
    fit: ThroughputFit | None = None,
    global_batch: int | None = None,
    nvme_path: str | None = None,
    names: Iterable[str] = COARSE,
) -> list[Ranked]:
    """Feasible configs of the space's grid over ``names`` (default the coarse grid, :data:`COARSE`), fastest
    predicted first (ties: grid order)."""
    fit = fit or ThroughputFit()
    ranked: list[Ranked] = []
    for suggestion in grid_suggestions(space, workload, names, global_batch, nvme_path):
        judged = _judge(suggestion, workload, calibration, fit)
        if judged is not None:
            ranked.append(Ranked(suggestion, *judged, params=enqueue_params(space, suggestion)))
    ranked.sort(key=lambda r: -r.prediction.tokens_per_s)
    return ranked


def enqueue_params(space: SearchSpace, suggestion: Suggestion) -> dict[str, Any]:
    """What ``enqueue_trial`` needs to reproduce the suggestion: its values, with defaults for unsearched ones.

    A fixed value outside its parameter's choices (the accumulation derived from a global batch, which ``suggest``
    never asks Optuna for) is left out: Optuna would refuse it as a value of that distribution.
    """
    searched = set(space.searched)
    fixed = {k: v for k, v in suggestion.fixed.items() if k in searched and space.parameter(k).contains(v)}
    return {**fixed, **suggestion.params}


def _shape(ranked: Ranked) -> tuple[Any, ...]:
    """Micro-batch, accumulation, checkpointing and the threads per rank (when searched): what decides compute
    efficiency and per-micro-step costs, and what the throughput model cannot predict (the threads' effect only a
    run shows)."""
    trial = ranked.suggestion.trial
    return (*trial.batch, trial.activation_checkpointing, trial.threads_per_rank)


def params_of(space: SearchSpace, trial: TrialConfig) -> dict[str, Any]:
    """The space's parameter values read back from a trial config (a parameter whose key is absent keeps its
    default)."""
    values: dict[str, Any] = {}
    for parameter in space.parameters:
        if parameter.train == "activation_checkpointing":
            values[parameter.name] = bool(trial.activation_checkpointing)
            continue
        node: Any = trial.ds_config
        for part in (parameter.key or "").split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None or parameter.contains(None):  # a null choice ("leave it unset") is a value too
            values[parameter.name] = node
    return values


def recheck_earlier(
    space: SearchSpace,
    workload: Workload,
    calibration: Calibration,
    earlier: Iterable[TrialConfig],
    fit: ThroughputFit | None = None,
    global_batch: int | None = None,
    nvme_path: str | None = None,
) -> list[Ranked]:
    """Earlier studies' best configs, adapted to this workload's batch and world
    size through the space and kept when they still fit; fastest predicted first."""
    fit = fit or ThroughputFit()
    kept: dict[str, Ranked] = {}
    for trial in earlier:
        suggestion = _suggest(space, params_of(space, trial), workload, global_batch, nvme_path)
        if suggestion is None or suggestion.key in kept:
            continue
        judged = _judge(suggestion, workload, calibration, fit)
        if judged is not None:
            kept[suggestion.key] = Ranked(suggestion, *judged, params=enqueue_params(space, suggestion))
    return sorted(kept.values(), key=lambda r: -r.prediction.tokens_per_s)


class ThroughputGuide:
    """The throughput model inside a study: warm start, refit after each run, and the model's next pick.

    ``store`` (a :class:`tuner.storage.Store`, optional, with ``hardware``: the calibration key the loop records)
    supplies earlier studies' best configs and fitted constants and keeps the refitted ones; without it the guide is
    pure (the bench's replays use it so).
    """

    def __init__(
        self,
        space: SearchSpace,
        workload: Workload,
        calibration: Calibration,
        *,
        global_batch: int | None = None,
        nvme_path: str | None = None,
        store: Any = None,
        hardware: str | None = None,
        fit: ThroughputFit | None = None,
    ) -> None:
        self.space, self.workload, self.calibration = space, workload, calibration
        self.global_batch, self.nvme_path, self.store = global_batch, nvme_path, store
        if store is not None and hardware is None:
            raise ValueError("hardware: the calibration key (as the tuning loop records it) is needed with a store")
        self.hardware = hardware or ""
        if fit is None:
            fit = load_fit(store, self.hardware, workload.model.family) if store is not None else ThroughputFit()
        self.fit = fit
        # a training command's own model without --model: nothing to predict, the sampler proposes alone
        self.ranked = (
            []
            if workload.model.is_unknown
            else rank_feasible(space, workload, calibration, fit, global_batch, nvme_path)
            or rank_feasible(space, workload, calibration, fit, global_batch, nvme_path, names=SAVERS)
        )
        self.measured: dict[str, float] = {}  # config key -> measured tokens/s
        self.proposed: set[str] = set()

    def warm_start(self, count: int = WARM_START, earlier: Iterable[TrialConfig] = ()) -> list[dict]:
        """Params to enqueue first: up to :data:`FROM_EARLIER` re-checked earlier best configs (``earlier``; with a
        store and none given, its best measured trials of the same model on other workloads), then the model's best."""
        if self.workload.model.is_unknown:
            return []
        if self.store is not None and not earlier:
            trials = self.store.nearest_measured_trials(
                self.workload.model.family,
                self.workload.model.n_params,
                self.workload.fingerprint(),
                workloads=10,
                per_workload=3,
            )
            earlier = [t.trial for t in trials]
        rechecked = recheck_earlier(
            self.space, self.workload, self.calibration, earlier, self.fit, self.global_batch, self.nvme_path
        )
        chosen = list(rechecked[:FROM_EARLIER])
        for candidate in self.ranked:  # one per batch shape: configs that differ only in ZeRO settings are
            if len(chosen) >= count:  # predicted alike, while compute efficiency against per-micro-step costs is
                break  # what the table knows least: spread the first runs over shapes
            if all(_shape(candidate) != _shape(c) for c in chosen):
                chosen.append(candidate)
        self.proposed.update(c.suggestion.key for c in chosen)
        return [dict(c.params) for c in chosen[:count]]

    def first_run(self) -> Ranked | None:
        """The config predicted fastest (what a new study measures first), or None when nothing fits."""
        return self.ranked[0] if self.ranked else None

    def after_run(self, suggestion: Suggestion, step_time_s: float | None, tokens_per_s: float | None) -> None:
        """Refit from one measured run (``step_time_s``: median seconds per optimizer step; nothing to fit from a
        failed run) and remember it as measured."""
        if step_time_s and tokens_per_s and not self.workload.model.is_unknown:
            terms = predict(self.workload, suggestion.trial).terms
            family = self.workload.model.family
            if self.store is not None:
                self.fit = record_run(self.store, self.hardware, family, terms, step_time_s, suggestion.key)
            else:
                self.fit = self.fit.after_run(terms, step_time_s, suggestion.key)
            self.measured[suggestion.key] = tokens_per_s
        self.proposed.add(suggestion.key)

    def predicted_tokens_per_s(self, ranked: Ranked) -> float:
        """The config's tokens/s under the current fit."""
        return ranked.prediction.tokens_per_s * ranked.prediction.step_time_s / self.fit.predict_s(ranked.terms)

    def tolerance(self) -> float:
        """How far below the best measured a prediction may be and still be worth a run: twice the fit's median
        out-of-sample error, at least :data:`MIN_TOLERANCE`."""
        error = self.fit.median_error()
        return max(MIN_TOLERANCE, 2 * error) if error is not None else MIN_TOLERANCE

    def recalibrate(self, calibration: Calibration) -> None:
        """Keep only the ranked configs that fit with ``calibration`` (a study's margin after its runs: an estimate
        that proved short, an out-of-memory run)."""
        self.calibration = calibration
        self.ranked = [r for r in self.ranked if calibration.fits(r.estimate.gpu_total, r.estimate.gpu_memory)]

    def next_pick(self) -> dict | None:
        """The params of the best predicted config not yet measured or proposed, when its prediction is within
        :meth:`tolerance` of the best measured tokens/s or above it; else None (the sampler goes on). While nothing
        has been measured, once the warm start's configs were proposed (they ran out of memory, failed or were
        stopped), the best predicted one left that fits with the calibration's margin: a study whose first runs
        failed goes on from the configs that fit rather than from random draws."""
        open_ = [r for r in self.ranked if r.suggestion.key not in self.proposed]
        if not open_ or not (self.measured or self.proposed):  # nothing proposed yet: the warm start goes first
            return None
        top = max(open_, key=self.predicted_tokens_per_s)
        if self.measured and self.predicted_tokens_per_s(top) < max(self.measured.values()) * (1 - self.tolerance()):
            return None
        self.proposed.add(top.suggestion.key)
        return dict(top.params)


__all__ = ["COARSE", "Ranked", "ThroughputGuide", "grid_suggestions", "params_of", "rank_feasible", "recheck_earlier"]
