"""Which layout trains a workload fastest by the throughput model, and why: the recommender's grid judged config by
config, grouped by layout (AutoTP degree × ZeRO++ hpZ group × Ulysses degree), and a sentence for the winner.

* :func:`judge_grid`: every config of a space's grid (:func:`tuner.forecast.warm_start.grid_suggestions`, so the
  space's own conditions decide which layouts a workload is offered) with its memory estimate, why it does not fit
  (:func:`tuner.forecast.memory_reason`) or, when it fits, its predicted throughput.
* :func:`simplest`: among fitting configs predicted within a tie of the best, the simplest (lowest ZeRO stage, fewest
  offloads, the plainest layout, no checkpointing, the largest micro-batch), deterministically.
* :func:`compare_layouts`: the best config of each layout (the winner for the winner's layout), fitting layouts
  fastest first, then the others closest to fitting first, and a one-line ``why`` for the winner against the
  runner-up.

Example:
    >>> from tuner.space import default_space_path, load_space
    >>> from tuner.forecast.calibration import Calibration
    >>> from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model
    >>> work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=2), TrainSpec(seq_len=512))
    >>> space = load_space(default_space_path()).restricted(["stage", "micro_batch"])
    >>> judged = judge_grid(space, work, Calibration(), names=["stage", "micro_batch"])
    >>> choices, why = compare_layouts(judged, simplest([j for j in judged if j.fits]), world_size=2)
    >>> [label(c.layout) for c in choices], why
    (['data parallel'], 'data parallel: the only layout the space offers this workload')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.estimator import ConfigError, MemoryEstimate, ThroughputPrediction, estimate, predict
from tuner.forecast.calibration import Calibration
from tuner.forecast.reasons import PruneReason, memory_reason
from tuner.forecast.throughput_fit import ThroughputFit
from tuner.forecast.warm_start import COARSE, grid_suggestions
from tuner.space import SearchSpace, Suggestion
from tuner.workload import ParallelLayout, TrialConfig, Workload
from tuner.workload.layouts import PLAINEST_FIRST

PREDICTION_TIE = 0.01  # predicted tokens/s within 1 % of the best are a tie, settled by simplicity


PLAIN = "data parallel"  # the label of the layout without Ulysses, AutoTP, AutoEP or hpZ


def label(layout: ParallelLayout) -> str:
    """The layout's label (:meth:`~tuner.workload.ParallelLayout.label`), ``data parallel`` for none."""
    return layout.label() or PLAIN


@dataclass(frozen=True)
class Judged:
    """One grid config: its estimate, why it does not fit (None: it fits) and, when it fits, its prediction."""

    suggestion: Suggestion
    estimate: MemoryEstimate
    reason: PruneReason | None
    prediction: ThroughputPrediction | None

    @property
    def trial(self) -> TrialConfig:
        return self.suggestion.trial

    @property
    def fits(self) -> bool:
        return self.reason is None

    @property
    def layout(self) -> ParallelLayout:
        return self.suggestion.trial.layout

    @property
    def tokens_per_s(self) -> float:
        """Predicted tokens/s (0 for a config that does not fit: it has no prediction)."""
        return self.prediction.tokens_per_s if self.prediction is not None else 0.0


def same_global_batch(suggestion: Suggestion, world_size: int) -> Suggestion:
    """``suggestion`` accumulating over the model-parallel ranks (sp × tp) it takes from data parallelism, so that it
    trains the global batch the plain data-parallel layout trains at the same micro-batch: layouts are compared per
    sample at one global batch, not at half the batch with the optimizer step's cost spread over half the tokens."""
    trial = suggestion.trial
    micro, accum = trial.batch
    spread = trial.layout.ranks(world_size).model_parallel
    if spread == 1 or micro is None:
        return suggestion
    accum = (accum or 1) * spread
    fixed = {**suggestion.fixed, "grad_accum": accum}
    return Suggestion(trial.with_batch(micro, accum, world_size), suggestion.params, fixed)


def judge_grid(
    space: SearchSpace,
    workload: Workload,
    calibration: Calibration,
    fit: ThroughputFit | None = None,
    names: Iterable[str] = COARSE,
    equal_batch: bool = False,
    global_batch: int | None = None,
) -> list[Judged]:
    """Every config of ``space``'s grid over ``names`` the estimator accepts, judged against the margin; only the
    fitting ones are predicted (a prediction is all the cost a non-fitting config would add). With ``equal_batch``
    every layout trains the global batch of data parallelism at the same micro-batch (:func:`same_global_batch`);
    with ``global_batch`` every config trains that many samples per step (the space derives the accumulation)."""
    fit = fit or ThroughputFit()
    judged: list[Judged] = []
    for suggestion in grid_suggestions(space, workload, names, global_batch):
        if equal_batch:
            suggestion = same_global_batch(suggestion, workload.cluster.world_size)
        try:
            est = estimate(workload, suggestion.trial)
        except ConfigError:
            continue
        reason = memory_reason(est, calibration)
        prediction = predict(workload, suggestion.trial, fit.factors) if reason is None else None
        judged.append(Judged(suggestion, est, reason, prediction))
    return judged


def simplicity(judged: Judged) -> tuple[Any, ...]:
    """Sort key, simplest first: the lowest ZeRO stage (least communication), the fewest offloads, the plainest
    layout, no checkpointing, the largest micro-batch."""
    trial = judged.trial
    offloads = sum(section.device != "none" for section in (trial.zero.offload_optimizer, trial.zero.offload_param))
    return trial.stage, offloads, judged.layout.sort_key, trial.activation_checkpointing, -(trial.batch[0] or 1)


def simplest(fitting: Sequence[Judged], tie: float = PREDICTION_TIE) -> Judged:
    """Of the fitting configs predicted within ``tie`` of the best, the simplest (:func:`simplicity`).

    Raises:
        ValueError: ``fitting`` is empty.
    """
    top = max(j.tokens_per_s for j in fitting)
    return min((j for j in fitting if j.tokens_per_s >= (1 - tie) * top), key=simplicity)


@dataclass(frozen=True)
class LayoutChoice:
    """The best config of one layout: the fastest predicted that fits (ties: :func:`simplest`), else the one that
    misses by the least, with why it does not fit."""

    layout: ParallelLayout
    best: Judged
    chosen: bool  # the recommendation's layout
    configs: int  # the grid's configs of this layout
    fitting: int  # of which fit
    world_size: int  # the ranks the global batch is counted on

    def to_dict(self) -> dict[str, Any]:
        """As the API shows it (``considered`` of ``/v1/recommend``)."""
        trial = self.best.trial
        micro, accum = trial.batch
        return {
            **{kind.field: self.layout.degree(kind) for kind in PLAINEST_FIRST},
            "chosen": self.chosen,
            "fits": self.best.fits,
            "predicted_tokens_per_s": self.best.prediction.tokens_per_s if self.best.prediction else None,
            "estimated_peak_bytes": self.best.estimate.gpu_total,
            "reason": self.best.reason.sentence() if self.best.reason else None,
            "stage": trial.stage,
            "micro_batch": micro,
            "grad_accum": accum,
            "global_batch": trial.global_batch(self.world_size),
            "activation_checkpointing": trial.activation_checkpointing,
            "offload_optimizer": trial.zero.offload_optimizer.device,
            "offload_param": trial.zero.offload_param.device,
            "configs": self.configs,
            "fitting": self.fitting,
        }


def _shortfall(judged: Judged) -> tuple[float, int]:
    """How far a config misses: the share of the memory it lacks, then its GPU peak."""
    reason = judged.reason
    share = reason.short / reason.available if reason is not None and reason.available else float("inf")
    return share, judged.estimate.gpu_total


def compare_layouts(
    judged: Sequence[Judged], winner: Judged, world_size: int, tie: float = PREDICTION_TIE
) -> tuple[list[LayoutChoice], str]:
    """The best config of each layout in ``judged`` (``winner`` for its own) at the winner's global batch (where a
    layout has a config there), fitting layouts fastest predicted first, then the others closest to fitting first;
    and why ``winner`` wins, in one line."""
    target = winner.trial.global_batch(world_size)
    groups: dict[ParallelLayout, list[Judged]] = {}
    for one in judged:
        groups.setdefault(one.layout, []).append(one)
    for layout, members in groups.items():
        groups[layout] = [j for j in members if j.trial.global_batch(world_size) == target] or members
    choices = []
    for layout, members in groups.items():
        fitting = [j for j in members if j.fits]
        if layout == winner.layout:
            best = winner
        elif fitting:
            best = simplest(fitting, tie)
        else:
            best = min(members, key=_shortfall)
        choices.append(LayoutChoice(layout, best, layout == winner.layout, len(members), len(fitting), world_size))
    choices.sort(key=lambda c: (not c.best.fits, -c.best.tokens_per_s, _shortfall(c.best), c.layout.sort_key))
    return choices, _why(choices, winner, tie)


def _why(choices: Sequence[LayoutChoice], winner: Judged, tie: float) -> str:
    name = label(winner.layout)
    if len(choices) == 1:
        return f"{name}: the only layout the space offers this workload"
    others = [c for c in choices if not c.chosen]
    unfit = [label(c.layout) for c in others if not c.best.fits]
    fit_count = len(choices) - len(unfit)
    unfit_text = f" ({', '.join(unfit)} {'does' if len(unfit) == 1 else 'do'} not)" if unfit else ""
    runner = next((c for c in others if c.best.fits), None)
    if runner is None:
        return f"{name}: the only one of {len(choices)} layouts that fits with the margin{unfit_text}"
    ratio = winner.tokens_per_s / runner.best.tokens_per_s
    against = f"the next layout ({label(runner.layout)}, {runner.best.tokens_per_s:,.0f} tokens/s)"
    if ratio >= 1 + tie:
        lead = f"{ratio:.2f}× the predicted tokens/s of {against}"
    else:
        lead = f"predicted within {tie:.0%} of {against} ({ratio:.3f}×), a tie the simpler config wins"
    return f"{name}: {lead}; {fit_count} of {len(choices)} layouts fit with the margin{unfit_text}"


__all__ = [
    "PLAIN",
    "PREDICTION_TIE",
    "Judged",
    "LayoutChoice",
    "compare_layouts",
    "judge_grid",
    "label",
    "same_global_batch",
    "simplest",
    "simplicity",
]
