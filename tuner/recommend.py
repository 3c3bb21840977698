"""The recommender: the best ds_config for a workload, from measurements when there are any, else from the estimator.

Three sources, tried in order; the answer always says which (``source``):

1. ``measured``: the workload (model, cluster, sequence length, precision, attention, trainable part) has measured
   trials: the ok trial with the highest
   tokens/s over all its studies.
2. ``nearest``: no measurement of this workload, but of the same model (family and parameter count) on another
   cluster or sequence length: the best ok trials of those workloads (:data:`NEAREST_PER_WORKLOAD` per workload, at
   most :data:`NEAREST_WORKLOADS` workloads) are re-checked by the estimator against the requested workload with the
   calibrated margin; the fastest that fits wins. Its throughput was measured on the other workload (``measured_on``).
3. ``estimate``: nothing measured applies: over the default search space's grid (:data:`GRID`: ZeRO stage ×
   micro-batch × activation checkpointing × optimizer and parameter offload × the layouts, AutoTP degree, ZeRO++ hpZ
   group and AutoEP degree, where the space offers them to the workload), the config that fits by the estimator with the
   margin and has the best *predicted* throughput (:func:`tuner.estimator.predict`, with the constants fitted on this
   hardware and model family's runs when there are any, else the hardware table). ``predicted_tokens_per_s`` and
   ``prediction`` say so; ``tokens_per_s`` stays null (nothing was measured). Predictions within :data:`PREDICTION_TIE`
   of the best count as equal (finer than the model can tell); among those the simplest wins, deterministically
   (:func:`tuner.forecast.layouts.simplicity`: the lowest ZeRO stage, the fewest offloads, the plainest layout, no
   checkpointing, the largest micro-batch). ``considered`` lists the best config of every layout judged (fits or not,
   and why not) and ``why`` says in one line why the winner's layout wins
   (:func:`tuner.forecast.layouts.compare_layouts`).

The longest sequence (:func:`recommend_longest`, the API's ``seq_len: "max"``): the longest length that fits with
the calibrated margin (:func:`tuner.forecast.longest_fit`), and the config that reaches it, ``source`` estimate.
Measured trials are not consulted there: no study measures at the limit.

Cost: a handful of indexed queries, asked of the store (:meth:`tuner.storage.Store.best_measured_trial` and
:meth:`~tuner.storage.Store.nearest_measured_trials`), never all trials loaded; the estimator grid is cached per
workload and margin.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tuner.estimator import ConfigError, MemoryEstimate, estimate, estimate_only_why, predict, resolve
from tuner.forecast import (
    PREDICTION_TIE,
    Calibration,
    LayoutChoice,
    LongestFit,
    Pins,
    ThroughputFit,
    compare_layouts,
    judge_grid,
    load_fit,
    longest_fit,
    simplest,
)
from tuner.measure.script.answer import COMMAND_HINT, script_answer
from tuner.space import default_space_path, load_space
from tuner.space.dsconfig import export_config
from tuner.storage import MeasuredTrial, Store
from tuner.study import AnswerFacts, answer_facts, numerics_facts
from tuner.units import format_bytes
from tuner.workload import TrialConfig, Workload
from tuner.workload.layouts import PLAINEST_FIRST

Source = Literal["measured", "nearest", "estimate"]
NEAREST_WORKLOADS = 10
NEAREST_PER_WORKLOAD = 3
MEASURED_CANDIDATES = 10  # the workload's fastest measured trials tried, for one that trains the asked global batch
# offload: without it no layout of a 70B-class model fits 16 × 80 GB (ZeRO-3's states alone are 16 B per parameter
# over the ranks); the layouts: what the space offers the workload (AutoTP from 1e9 parameters on multi-GPU nodes,
# hpZ at ZeRO-3 across nodes, AutoEP for transformers MoE models on 2+ ranks), by its own conditions
GRID = (
    "stage",
    "micro_batch",
    "activation_checkpointing",
    "offload_optimizer",
    "offload_param",
    *(kind.field for kind in PLAINEST_FIRST if not kind.memory_saver),
)


NOT_MEASURED = (
    "no measured config of this training command's own model{at}: without a description of the model dstune "
    "cannot estimate nor adapt one (tune the command first, or give its model)"
)


class NoFeasibleConfig(Exception):
    """Nothing measured applies and no config of the default space fits the workload."""


@dataclass(frozen=True)
class Recommendation:
    """What to train with (``trial``) and why. ``peak_bytes`` is measured (None for ``estimate``);
    ``estimated_peak_bytes`` is the estimator's peak per GPU for the requested workload."""

    source: Source
    trial: TrialConfig
    tokens_per_s: float | None
    peak_bytes: int | None
    estimated_peak_bytes: int | None
    trial_id: int | None
    study: str | None
    workload_fingerprint: str
    measured_on: str | None
    margin: float
    predicted_tokens_per_s: float | None = None
    prediction: dict[str, Any] | None = None
    estimate_only: bool = False  # the estimate cannot be checked by a run here (a 4-bit base...)
    estimate_only_why: str | None = None
    considered: tuple[LayoutChoice, ...] | None = None  # source estimate: the best config of each layout
    why: str | None = None  # source estimate: why the winner's layout wins, in one line
    trial_number: int | None = None  # the measured trial's number in its study, as the CLI and dashboard show it
    measured_global_batch: int | None = None  # the measured trial's own samples per step
    global_batch: int | None = None  # the answer's samples per optimizer step
    exported: tuple[dict[str, Any], tuple[str, ...]] | None = None  # what ``dstune best`` writes: config, notes
    facts: AnswerFacts | None = None  # a measured trial's: numerics choices, who measured, its confirmation

    def to_dict(self) -> dict[str, Any]:
        """The fields as the API shows them: the trial config as ``dstune best`` exports it (``ds_config``, with its
        ``notes``) and ``activation_checkpointing``, each considered layout as a dict."""
        fields = dict(self.__dict__)
        trial, exported = fields.pop("trial"), fields.pop("exported")
        config, notes = exported if exported is not None else (trial.ds_config, ())
        considered = fields.pop("considered")
        fields["considered"] = None if considered is None else [choice.to_dict() for choice in considered]
        facts = fields.pop("facts")
        numerics = numerics_facts(trial)
        fields.update(numerics=list(numerics.choices), changes_numerics=numerics.changes_numerics)
        if facts is not None:
            fields.update(measured_with=facts.measured_with, confirmation=facts.confirmation_dict())
        return {"source": fields.pop("source"), "ds_config": config, "notes": list(notes),
                "activation_checkpointing": trial.activation_checkpointing, **fields}  # fmt: skip


def recommend(store: Store, workload: Workload, global_batch: int | None = None) -> Recommendation:
    """The best config for ``workload``: measured, else nearest re-checked, else estimated (module docstring); with
    ``global_batch``, one that trains that many samples per optimizer step (a measured config's accumulation
    re-derived for it and re-checked by the estimator).

    Raises:
        tuner.estimator.ConfigError: ``global_batch`` is not a multiple of the ranks (field ``global_batch``).
        NoFeasibleConfig: nothing fits.
    """
    world = workload.cluster.world_size
    if global_batch is not None and (global_batch < 1 or global_batch % world):
        raise ConfigError("global_batch", f"{global_batch} is not a positive multiple of the {world} ranks")
    fingerprint = workload.fingerprint()
    calibration = store.get_calibration(workload.cluster.hardware_key, workload.model.family)
    margin = calibration.margin if calibration is not None else Calibration().margin
    own = store.best_measured_trials(fingerprint, MEASURED_CANDIDATES)
    found = _measured("measured", own, workload, fingerprint, margin, global_batch)
    if found is None and workload.model.is_unknown:  # nothing to estimate, adapt or compare it with
        raise NoFeasibleConfig(
            NOT_MEASURED.format(at="" if global_batch is None else f" at global batch {global_batch}")
        )
    found = found or _nearest(store, workload, fingerprint, margin, global_batch)
    if found is None:
        fit = load_fit(store, workload.cluster.hardware_key, workload.model.family)
        found = _marked(workload, _estimated(workload, fingerprint, margin, fit, global_batch))
    return _script_figures(store, _exported(workload, found))


def _script_figures(store: Store, found: Recommendation) -> Recommendation:
    """A measured answer with what is said beside its trial (:func:`tuner.study.answer_facts`); from a study of the
    user's own training command, its figures are the command's, said in a note that says where the command is
    (``dstune best``), and (measured as it is) the config is the one the command got."""
    record = store.get_trial(found.trial_id) if found.trial_id is not None else None
    found = replace(found, facts=answer_facts(record)) if record is not None else found
    answer = script_answer(((record.measurement if record else None) or {}).get("script"))
    if answer is None or record is None or found.exported is None:
        return found
    config, notes = found.exported
    if record.trial.key == found.trial.key:
        config = answer["ds_config"]
    # not the command itself: /v1/recommend is open to anyone, and a command may hold paths or a token
    said = (f"{answer['note']} ({COMMAND_HINT})", *([answer["code_paths"]] if answer.get("code_paths") else []))
    return replace(found, exported=(config, (*notes, *said)))


def _exported(workload: Workload, found: Recommendation) -> Recommendation:
    """``found`` with its global batch and the config ``dstune best`` would export for it
    (:func:`tuner.space.dsconfig.export_config`: the ds_config DeepSpeed gets and the notes that go with it)."""
    train = workload.train
    config, notes = export_config(found.trial, "deepspeed", train.attention, workload.trainable, train.seq_len)
    return replace(
        found, global_batch=found.trial.global_batch(workload.cluster.world_size), exported=(config, tuple(notes))
    )


def recommend_longest(store: Store, workload: Workload) -> tuple[Recommendation, LongestFit]:
    """The longest sequence ``workload``'s model trains at on its cluster with the calibrated margin, and the config
    that reaches it, as a recommendation (``source`` estimate) at that length.

    Raises:
        tuner.forecast.NoLengthFits: nothing fits at the shortest length.
    """
    calibration = store.get_calibration(workload.cluster.hardware_key, workload.model.family)
    margin = calibration.margin if calibration is not None else Calibration().margin
    fit = load_fit(store, workload.cluster.hardware_key, workload.model.family)
    answer = longest_fit(workload, Pins(), margin, fit.factors)
    prediction = predict(answer.workload, answer.trial, fit.factors).to_dict()
    found = Recommendation(
        "estimate",
        answer.trial,
        None,
        None,
        answer.estimate.gpu_total,
        None,
        None,
        answer.workload.fingerprint(),
        None,
        margin,
        predicted_tokens_per_s=prediction["tokens_per_s"],
        prediction=prediction,
    )
    return _exported(answer.workload, _marked(answer.workload, found)), answer


def _marked(workload: Workload, found: Recommendation) -> Recommendation:
    """``found`` marked estimate only where no run here can check its estimate (:func:`estimate_only_why`)."""
    why = estimate_only_why(workload, resolve(workload, found.trial).quantized_nontrainable)
    return replace(found, estimate_only=True, estimate_only_why=why) if why else found


def _nearest(
    store: Store, workload: Workload, fingerprint: str, margin: float, global_batch: int | None
) -> Recommendation | None:
    candidates = store.nearest_measured_trials(
        workload.model.family,
        workload.model.n_params,
        fingerprint,
        workloads=NEAREST_WORKLOADS,
        per_workload=NEAREST_PER_WORKLOAD,
    )
    return _measured("nearest", candidates, workload, fingerprint, margin, global_batch)


def _measured(
    source: Source,
    candidates: Sequence[MeasuredTrial],
    workload: Workload,
    fingerprint: str,
    margin: float,
    global_batch: int | None,
) -> Recommendation | None:
    """The first of ``candidates`` (fastest first) that trains ``workload``: as measured (``measured``, at its own
    global batch or none asked), else adapted to the workload's ranks and ``global_batch`` and fitting by the
    estimator with the margin."""
    world = workload.cluster.world_size
    for candidate in candidates:
        measured_batch = _global_batch(candidate.trial, world)
        if source == "measured" and global_batch in (None, measured_batch):
            trial, peak = candidate.trial, candidate.estimated_peak_bytes
        elif workload.model.is_unknown:  # a command's own model: a config is as measured or not at all
            continue
        else:
            checked = _recheck(workload, candidate.trial, Calibration(margin=margin), global_batch)
            if checked is None:
                continue
            trial, peak = checked[0], checked[1].gpu_total
        return Recommendation(
            source,
            trial,
            candidate.tokens_per_s,
            candidate.peak_bytes,
            peak,
            candidate.trial_id,
            candidate.study,
            fingerprint,
            candidate.workload_fingerprint,
            margin,
            trial_number=candidate.number,
            measured_global_batch=measured_batch,
        )
    return None


def _global_batch(trial: TrialConfig, world: int) -> int | None:
    """``trial``'s samples per step on ``world`` ranks (None where its config cannot say)."""
    try:
        return trial.global_batch(world)
    except (ConfigError, ValueError, TypeError, ArithmeticError):
        return None


def _recheck(
    workload: Workload, measured: TrialConfig, calibration: Calibration, global_batch: int | None = None
) -> tuple[TrialConfig, MemoryEstimate] | None:
    """The measured config adapted to ``workload`` (its micro-batch kept; its accumulation kept, or derived for
    ``global_batch``; the global batch follows the world size) and its estimate, when it fits with the margin; else
    None."""
    micro, accum = (1 if value is None else value for value in measured.batch)
    if not (isinstance(micro, int) and isinstance(accum, int)) or micro < 1 or accum < 1:
        return None
    try:
        world = workload.cluster.world_size
        if global_batch is not None:
            per_step = micro * measured.layout.data_parallel(world)
            if global_batch % per_step:
                return None
            accum = global_batch // per_step
        trial = measured.with_batch(micro, accum, world)
        est = estimate(workload, trial)
    except (ConfigError, ValueError, TypeError, ArithmeticError):
        return None
    if not (calibration.fits(est.gpu_total, est.gpu_memory) and est.cpu_headroom >= 0):
        return None
    return trial, est


@functools.cache
def _grid_space() -> Any:
    return load_space(default_space_path()).restricted(list(GRID))


def _estimated(
    workload: Workload,
    fingerprint: str,
    margin: float,
    fit: ThroughputFit | None = None,
    global_batch: int | None = None,
) -> Recommendation:
    fit = fit or ThroughputFit()
    factors = tuple(sorted(fit.factors.items()))
    found = _estimated_cached(workload, margin, factors, len(fit.runs), fit.median_error(), global_batch)
    if found is None:
        at = "" if global_batch is None else f" at global batch {global_batch}"
        raise NoFeasibleConfig(
            f"no config of the default search space (stage × micro-batch × checkpointing × offload × layout) fits "
            f"{workload.model.name} on {workload.cluster.world_size} × {format_bytes(workload.cluster.gpu_memory)} "
            f"with margin {margin:.3f}{at}"
        )
    trial, peak, prediction, considered, why = found
    return Recommendation(
        "estimate",
        trial,
        None,
        None,
        peak,
        None,
        None,
        fingerprint,
        None,
        margin,
        predicted_tokens_per_s=prediction["tokens_per_s"],
        prediction=prediction,
        considered=considered,
        why=why,
    )


@functools.lru_cache(maxsize=1024)
def _estimated_cached(
    workload: Workload,
    margin: float,
    factors: tuple[tuple[str, float], ...],
    fit_runs: int,
    error: float | None,
    global_batch: int | None = None,
) -> tuple[TrialConfig, int, dict[str, Any], tuple[LayoutChoice, ...], str] | None:
    """The grid judged (at ``global_batch``, else each layout at data parallelism's global batch for its
    micro-batch) and the simplest of the fastest fitting configs, with the layouts compared."""
    fit = ThroughputFit(dict(factors))
    calibration = Calibration(margin=margin)
    judged = judge_grid(_grid_space(), workload, calibration, fit, GRID, global_batch is None, global_batch)
    fitting = [j for j in judged if j.fits]
    if not fitting:
        return None
    best = simplest(fitting, PREDICTION_TIE)
    considered, why = compare_layouts(judged, best, workload.cluster.world_size, PREDICTION_TIE)
    assert best.prediction is not None  # it fits
    return best.trial, best.estimate.gpu_total, best.prediction.to_dict(fit_runs, error), tuple(considered), why


__all__ = ["NoFeasibleConfig", "Recommendation", "recommend"]
