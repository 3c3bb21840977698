"""Measured runs (and wall time) a search method needs to get within 2 % of the best config, on measured landscapes.

1. A landscape (``--measure``): every config of a small space (ZeRO stage × micro-batch × activation checkpointing
   at a fixed global batch, everything else pinned) is judged by the estimator against ``--gpu-memory`` with the
   default safety margin. Configs that cannot fit are recorded as pruned; every other one is measured ``--rounds``
   times on real DeepSpeed CPU ranks (``run_measurement``, local launcher), the fastest kept. It lands in SQL
   (``tuner.storage``, study ``landscape-<workload fingerprint>`` in ``bench/results/landscape.db``, reused unless
   ``--remeasure``) and in ``bench/results/landscapes/<model>-s<seq>-w<world>.json``, which git keeps.
2. The replay, side by side on every landscape JSON (``--landscapes``; default: all of them), ``--seeds`` times per
   method, no new runs, through the same ask → suggest → config key → estimate → tell steps as ``tuner.study``:

   * ``tpe``: TPE (multivariate, seeded) with estimator pruning: a config that cannot fit costs no run.
   * ``tpe-model``: TPE with the throughput model (:class:`tuner.forecast.ThroughputGuide`): its best
     feasible configs enqueued first (one per batch shape), a refit after every measured run, and the refitted
     model's pick enqueued while it predicts one within its error of the best measured; TPE proposes the rest.
   * ``tpe-model-xfer`` (reference): the same, starting from constants fitted on the other landscapes (same CPU host,
     other model family and world size): the cross-family transfer the store does not make.
   * ``random``: random search without pruning: a config that cannot fit costs a run (an out-of-memory failure).
   * ``grid``: the DeepSpeed-autotuner-like baseline, a grid over stage × micro-batch (no checkpointing), shuffled.
   * ``grid-full``: the grid over all three parameters, shuffled, no pruning; ``tpe-nopruning`` (reference).

   A config proposed again costs nothing. A replay stops once its best measured throughput is within ``--within``
   of the landscape's best, when every config it can propose has been tried, or after ``--max-asks`` asks. Wall
   time is the sum of the measured runs' own wall seconds (where the landscape recorded them). For the guided
   methods the refitted model's Spearman rank correlation with the measured landscape after 5 runs is reported.

Run: ``PYTHONPATH=$PWD python bench/search_efficiency.py`` (replay only, seconds); measuring a landscape adds
``--measure --model ... --seq-len ... --world-size ... --gpu-memory ...`` with ``TORCH_EXTENSIONS_DIR`` and
``DS_ACCELERATOR=cpu`` set. Writes ``bench/results/search_efficiency.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
import yaml
from optuna.trial import FixedTrial, TrialState

from tuner.estimator import estimate
from tuner.forecast import Calibration, ThroughputFit, ThroughputGuide, spearman
from tuner.measure.measurement import percentile
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.space import InfeasibleConfig, SearchSpace, Suggestion, parse_space
from tuner.storage import RETRYABLE_STATUSES, Store, TrialRecord, TrialRow
from tuner.study import GRID_PARAMETERS, StudySettings, capacity_reason, make_sampler
from tuner.units import parse_bytes
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

HERE = Path(__file__).resolve().parent
SPACE_YAML = """
version: 1
description: search-efficiency bench space, 4 stages x 4 micro-batches x checkpointing at a fixed global batch
base:
  optimizer: {params: {lr: 1.0e-4, torch_adam: true}}  # torch's Adam: no fused CPU extension to build on CPU
  gradient_clipping: 1.0
  zero_optimization:  # small buckets so CPU runs stay quick; the same for every config
    reduce_bucket_size: 500_000
    allgather_bucket_size: 500_000
    stage3_prefetch_bucket_size: 500_000
parameters:
  stage: {kind: categorical, choices: [0, 1, 2, 3], key: zero_optimization.stage, default: 0}
  micro_batch: {kind: categorical, choices: [1, 2, 4, 8], key: train_micro_batch_size_per_gpu, default: 1}
  activation_checkpointing: {kind: categorical, choices: [false, true], train: activation_checkpointing, default: false}
"""
SAMPLERS = ("tpe", "tpe-model", "tpe-model-xfer", "random", "grid", "grid-full", "tpe-nopruning")
PRUNING = {
    "tpe": True,
    "tpe-model": True,
    "tpe-model-xfer": True,
    "random": False,
    "grid": False,
    "grid-full": False,
    "tpe-nopruning": False,
}
SPEARMAN_AFTER = 5  # measured runs after which the refitted model's ranking of the landscape is scored
SUMMARY = ("tpe-model", "tpe", "grid", "grid-full", "random")
HARDWARE = "cpu"

optuna.logging.set_verbosity(optuna.logging.ERROR)


@dataclass
class Point:
    """One config of the landscape: whether the estimator lets it fit and, if so, its measured throughput."""

    params: dict[str, Any]
    key: str
    fits: bool
    tokens_per_s: float | None
    constraint: float
    estimated_peak: int
    status: str
    step_p50: float | None = None
    step_p90: float | None = None
    duration_s: float | None = None

    @property
    def label(self) -> str:
        p = self.params
        return f"z{p['stage']} mb{p['micro_batch']}" + (" ckpt" if p["activation_checkpointing"] else "")


def build_space() -> SearchSpace:
    return parse_space(yaml.safe_load(SPACE_YAML), "search_efficiency.yaml")


def enumerate_configs(space: SearchSpace, workload: Workload, global_batch: int) -> list[Suggestion]:
    """Every config of the space, in grid order."""
    grid = space.grid(global_batch=global_batch, world_size=workload.cluster.world_size)
    names = list(grid)
    return [
        space.suggest(FixedTrial(dict(zip(names, values, strict=True))), workload, global_batch)
        for values in itertools.product(*grid.values())
    ]


def landscape(args: argparse.Namespace, space: SearchSpace, workload: Workload) -> tuple[list[Point], float, float]:
    """Measure (or read back) every config once; returns the points, this run's seconds and the stored run seconds."""
    calibration = Calibration()  # the default margin: the landscape must not shift while it is measured
    args.db.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with Store.open(f"sqlite:///{args.db}") as store:
        workload_id = store.upsert_workload(workload)
        name = f"landscape-{workload.fingerprint()}"
        settings = {"space": SPACE_YAML, "global_batch": args.global_batch, "warmup": args.warmup, "steps": args.steps}
        study = store.get_or_create_study(name, workload_id, sampler="landscape", settings=settings)
        if args.remeasure:
            with store.session() as session:
                session.execute(sa.delete(TrialRow).where(TrialRow.study_id == study.id))
        store.mark_stale_running_failed(study.id)  # a run this bench was killed in: measure it again
        configs = enumerate_configs(space, workload, args.global_batch)
        pending: list[tuple[int, Suggestion, Workload, int]] = []
        for number, suggestion in enumerate(configs):
            stored = store.find_trial_by_key(study.id, suggestion.key)
            if stored is not None and stored.status not in RETRYABLE_STATUSES:  # ok, pruned, oom, invalid_config
                continue
            est = estimate(workload, suggestion.trial)
            peak = est.per_gpu["total"] or 0
            constraint = peak * (1 + calibration.margin) / est.gpu_memory - 1
            reason = capacity_reason(est, calibration)
            params = dict(suggestion.params)
            if stored is None:
                trial_id = store.add_trial(
                    study.id,
                    number,
                    suggestion.key,
                    suggestion.trial.ds_config,
                    params,
                    suggestion.trial.activation_checkpointing,
                    est,
                    "pruned" if reason else "pending",
                    prune_reason=reason,
                    constraint=constraint,
                    hardware=HARDWARE,
                )
            else:
                trial_id = store.retry_trial(stored.id, number).id
            label = Point(params, suggestion.key, reason is None, None, constraint, peak, "").label
            if reason is not None:
                print(f"  {label:14s} cannot fit (estimated {peak / 2**20:.2f} MiB): not measured", flush=True)
                continue
            pending.append((trial_id, suggestion, workload, number))
        # Every config is measured --rounds times, round-robin, and keeps its fastest run: a burst of load from
        # other processes then slows one run of each config, not every run of the configs measured during it.
        best: dict[int, Any] = {}
        measuring = time.monotonic()
        for round_number in range(args.rounds):
            for trial_id, suggestion, trial_workload, _ in pending:
                options = MeasureOptions("local", warmup=args.warmup, steps=args.steps)
                run = run_measurement(trial_workload, suggestion.trial, options)
                kept = best.get(trial_id)
                if kept is None or (run.tokens_per_s or 0) > (kept.tokens_per_s or 0):
                    best[trial_id] = run
                label = Point(dict(suggestion.params), suggestion.key, True, None, 0.0, 0, "").label
                print(
                    f"  round {round_number + 1} {label:14s} {run.status:7s} {run.tokens_per_s or 0:9.1f} tokens/s",
                    flush=True,
                )
        measured_s = time.monotonic() - measuring
        for trial_id, _, _, _ in pending:
            run = best[trial_id]
            store.start_trial(trial_id)
            store.finish_trial(trial_id, run.status, run.to_dict(with_ranks=False), error=run.error)
        records = {t.config_key: t for t in store.trials(study.id)}
        points = [to_point(suggestion, records[suggestion.key]) for suggestion in configs]
    return points, time.monotonic() - started, measured_s


def to_point(suggestion: Suggestion, record: TrialRecord) -> Point:
    step = (record.measurement or {}).get("step_time_s") or {}
    return Point(
        params=dict(suggestion.params),
        key=suggestion.key,
        fits=record.status != "pruned",
        tokens_per_s=record.tokens_per_s if record.status == "ok" else None,
        constraint=record.constraint if record.constraint is not None else 0.0,
        estimated_peak=record.estimated_peak_bytes or 0,
        status=record.status,
        step_p50=step.get("p50"),
        step_p90=step.get("p90"),
        duration_s=((record.measurement or {}).get("timings") or {}).get("wall_s"),  # the kept run's own wall time
    )


@dataclass
class Outcome:
    """One replay: measured runs to the target (None: never), the measured wall seconds of those runs (``complete``:
    every run's wall time is known; else a lower bound: out-of-memory runs and landscapes without durations), and for
    guided replays the refitted model's Spearman over the landscape after SPEARMAN_AFTER runs."""

    runs: int | None
    wall_s: float | None
    complete: bool
    spearman: float | None = None


def replay(
    sampler_name: str,
    seed: int,
    space: SearchSpace,
    workload: Workload,
    global_batch: int,
    args: argparse.Namespace,
    by_key: dict[str, Point],
    target: float,
    prior: ThroughputFit | None = None,
) -> Outcome:
    """Measured runs until the best-so-far reaches ``target``.

    ``tpe-model`` and ``tpe-model-xfer`` are TPE with :class:`tuner.forecast.ThroughputGuide`, exactly the
    calls the tuning loop makes: the model's best feasible configs enqueued first, a refit after every measured run
    and the refitted model's pick enqueued while it predicts one within its error of the best measured; ``-xfer``
    starts from ``prior`` (constants fitted on the other landscapes) instead of the table. Guided replays go on
    past the target until SPEARMAN_AFTER runs, to score the refitted model; their count is the runs at the target.
    """
    settings = StudySettings(
        name=f"replay-{sampler_name}-{seed}",
        workload=workload,
        space_path=HERE / "search_efficiency.py",
        global_batch=global_batch,
        sampler=sampler_name.split("-")[0],
        seed=seed,
    )
    if sampler_name == "grid":
        trial_space = space.restricted(list(GRID_PARAMETERS))
        sampler = make_sampler("grid", trial_space, settings)
    elif sampler_name == "grid-full":
        trial_space = space
        grid = space.grid(global_batch=global_batch, world_size=workload.cluster.world_size)
        sampler = optuna.samplers.GridSampler(grid, seed=seed)
    else:
        trial_space = space
        sampler = make_sampler(settings.sampler, space, settings)
    reachable = len(enumerate_configs(trial_space, workload, global_batch))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    guide = None
    if sampler_name.startswith("tpe-model"):
        fit = prior.starting_from() if sampler_name.endswith("xfer") and prior is not None else None
        guide = ThroughputGuide(space, workload, Calibration(), global_batch=global_batch, fit=fit)
        for params in guide.warm_start():
            study.enqueue_trial(params)
    pruning = PRUNING[sampler_name]
    seen: dict[str, tuple[TrialState, float | None, float]] = {}
    runs, best, wall, known, rho = 0, -math.inf, 0.0, True, None
    reached: tuple[int, float, bool] | None = None
    for _ in range(args.max_asks):
        if guide is not None and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            pick = guide.next_pick()  # as the tuning loop asks it: only when no enqueued trial is waiting
            if pick is not None:
                study.enqueue_trial(pick)
        trial = study.ask()
        try:
            suggestion = trial_space.suggest(trial, workload, global_batch)
        except InfeasibleConfig:  # not expected in this space: every micro-batch offered divides the global batch
            trial.set_constraint("memory", 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        point = by_key[suggestion.key]
        if suggestion.key not in seen:
            if point.fits and point.tokens_per_s is not None:
                runs += 1
                wall, known = wall + (point.duration_s or 0.0), known and point.duration_s is not None
                seen[suggestion.key] = (TrialState.COMPLETE, point.tokens_per_s, point.constraint)
                best = max(best, point.tokens_per_s)
                if guide is not None:
                    step_s = global_batch * workload.train.seq_len / point.tokens_per_s
                    guide.after_run(suggestion, step_s, point.tokens_per_s)
                    if runs == SPEARMAN_AFTER:
                        rho = model_spearman(guide, by_key)
            elif point.fits or not pruning:  # a failed run, or an out-of-memory run the estimator did not stop
                runs += 1
                known = False  # an out-of-memory run: its wall time was never measured
                seen[suggestion.key] = (TrialState.FAIL, None, 1.0)
            else:
                seen[suggestion.key] = (TrialState.PRUNED, None, point.constraint)
        state, value, constraint = seen[suggestion.key]
        trial.set_constraint("memory", constraint)
        try:
            study.tell(trial, values=None if value is None else [value], state=state)
        except RuntimeError:  # GridSampler calls study.stop() once exhausted, which ask-and-tell refuses (Optuna 5)
            if not isinstance(sampler, optuna.samplers.GridSampler):  # the trial is stored by then: go on
                raise
        if best >= target and reached is None:
            reached = (runs, wall, known)
        if reached is not None and (guide is None or runs >= SPEARMAN_AFTER):
            break
        if len(seen) >= reachable:
            break
    if reached is None:
        return Outcome(None, None, False, rho)
    return Outcome(reached[0], reached[1], reached[2], rho)


def model_spearman(guide: ThroughputGuide, by_key: dict[str, Point]) -> float:
    """Spearman between the guide's current predictions and the measured tokens/s over every measured config."""
    pairs = [
        (guide.predicted_tokens_per_s(r), by_key[r.suggestion.key].tokens_per_s)
        for r in guide.ranked
        if by_key[r.suggestion.key].tokens_per_s is not None
    ]
    return spearman([p for p, _ in pairs], [m for _, m in pairs])


def describe(counts: list[int | None]) -> dict[str, Any]:
    reached = [c for c in counts if c is not None]
    ordered = [math.inf if c is None else c for c in counts]
    return {
        "reached": len(reached),
        "median": statistics.median(ordered),
        "mean": statistics.fmean(reached) if reached else math.inf,
        "p90": percentile(ordered, 0.9) if all(math.isfinite(c) for c in ordered) else _p90_with_inf(ordered),
        "min": min(ordered),
        "max": max(ordered),
    }


def _p90_with_inf(ordered: list[float]) -> float:
    values = sorted(ordered)
    position = (len(values) - 1) * 0.9
    low, high = values[int(position)], values[min(int(position) + 1, len(values) - 1)]
    return math.inf if math.isinf(high) else low + (high - low) * (position - int(position))


def fmt(value: float) -> str:
    if math.isinf(value):
        return "not reached"
    return f"{value:.1f}" if value != int(value) else f"{int(value)}"


def ratio(numerator: float, denominator: float) -> str:
    if math.isinf(numerator) and not math.isinf(denominator):
        return "∞ (never reaches the target)"
    if math.isinf(denominator):
        return "n/a"
    return f"{numerator / denominator:.2f}×"


def workload_of(spec: dict[str, Any]) -> Workload:
    """The landscape's workload from its JSON ``workload`` spec."""
    return Workload(
        load_builtin_model(spec["model"]),
        ClusterSpec(gpus_per_node=spec["world_size"], device="cpu", gpu_memory=parse_bytes(spec["gpu_memory"])),
        TrainSpec(seq_len=spec["seq_len"], precision=spec["precision"]),
    )


def landscape_name(spec: dict[str, Any]) -> str:
    """``<model>-s<seq>-w<world>``; a ``config.json`` model is named by its folder (``path/to/mixtral/config.json``:
    ``mixtral``), so its landscape lands in ``bench/results/landscapes/`` like a preset's, never beside the file."""
    model = Path(spec["model"])
    if model.suffix == ".json" or model.is_dir():
        model = (model.parent if model.suffix == ".json" else model).resolve()
    return f"{model.name}-s{spec['seq_len']}-w{spec['world_size']}"


def save_landscape(path: Path, spec: dict[str, Any], measured: dict[str, Any], points: list[Point]) -> None:
    """The landscape as JSON (kept in git: the SQLite database is not)."""
    rows = [
        {
            "params": p.params,
            "fits": p.fits,
            "status": p.status,
            "tokens_per_s": p.tokens_per_s,
            "step_p50": p.step_p50,
            "step_p90": p.step_p90,
            "duration_s": p.duration_s,
        }
        for p in points
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"workload": spec, "measured": measured, "points": rows}, indent=1) + "\n")


def load_landscape(path: Path, space: SearchSpace) -> tuple[dict[str, Any], dict[str, Any], list[Point]]:
    """A JSON landscape, its points keyed and estimated again for this space and the default margin."""
    data = json.loads(path.read_text())
    spec = data["workload"]
    workload = workload_of(spec)
    stored = {json.dumps(row["params"], sort_keys=True): row for row in data["points"]}
    points = []
    for suggestion in enumerate_configs(space, workload, spec["global_batch"]):
        row = stored[json.dumps(dict(suggestion.params), sort_keys=True)]
        est = estimate(workload, suggestion.trial)
        peak = est.per_gpu["total"] or 0
        constraint = peak * (1 + Calibration().margin) / est.gpu_memory - 1
        points.append(
            Point(
                params=dict(suggestion.params),
                key=suggestion.key,
                # judged by today's estimator at the landscape's budget, as a study today would: a config measured
                # when an earlier estimate let it run, but over the budget now, is pruned (an infeasible run)
                fits=row["fits"] and constraint <= 0,
                tokens_per_s=row["tokens_per_s"],
                constraint=constraint,
                estimated_peak=peak,
                status=row["status"],
                step_p50=row.get("step_p50"),
                step_p90=row.get("step_p90"),
                duration_s=row.get("duration_s"),
            )
        )
    return spec, data.get("measured", {}), points


def fit_over(space: SearchSpace, landscapes: list[tuple[dict[str, Any], list[Point]]]) -> ThroughputFit:
    """Constants fitted on every measured config of ``landscapes`` (the warm start's prior for another one)."""
    fit = ThroughputFit()
    for spec, points in landscapes:
        workload = workload_of(spec)
        guide = ThroughputGuide(space, workload, Calibration(), global_batch=spec["global_batch"])
        for ranked in guide.ranked:
            point = next(p for p in points if p.key == ranked.suggestion.key)
            if point.tokens_per_s:
                fit = fit.after_run(ranked.terms, spec["global_batch"] * spec["seq_len"] / point.tokens_per_s)
    return fit


NOTES = {
    "tpe": "TPE multivariate, estimator pruning (an infeasible config costs 0 runs)",
    "tpe-model": "TPE + throughput model + warm start: the model's 3 best feasible configs (one per batch shape) "
    "first, a refit after each run, its pick enqueued while within its error of the best measured",
    "tpe-model-xfer": "reference: as tpe-model, from constants fitted on the other landscape (another model family and "
    "world size on this CPU host)",
    "random": "random, no pruning (an infeasible config costs a run)",
    "grid": "DeepSpeed-autotuner-like grid stage × micro-batch (checkpointing off), seeded shuffle, no pruning",
    "grid-full": "the full grid over all 32 configs, seeded shuffle, no pruning",
    "tpe-nopruning": "reference: TPE multivariate, no pruning",
}


def section(
    args: argparse.Namespace,
    space: SearchSpace,
    spec: dict[str, Any],
    measured_info: dict[str, Any],
    points: list[Point],
    prior: ThroughputFit,
) -> tuple[list[str], str]:
    """Replay every sampler on one landscape; the markdown section and its row of the summary table."""
    workload = workload_of(spec)
    global_batch = spec["global_batch"]
    by_key = {point.key: point for point in points}
    measured = [p for p in points if p.fits and p.tokens_per_s is not None]  # what a study today may run
    best = max(p.tokens_per_s for p in measured)
    target = (1 - args.within) * best
    near = [p for p in measured if p.tokens_per_s >= target]
    feasible = [p for p in points if p.fits]
    failed = [p for p in points if p.fits and p.tokens_per_s is None]
    noisy = [p for p in measured if p.step_p50 and p.step_p90 and p.step_p90 > 1.5 * p.step_p50]
    over_now = [p for p in points if not p.fits and p.tokens_per_s is not None]  # measured, over budget today
    guide = ThroughputGuide(space, workload, Calibration(), global_batch=global_batch)
    prior_rho = model_spearman(guide, by_key)
    full = fit_over(space, [(spec, points)])
    full_guide = ThroughputGuide(space, workload, Calibration(), global_batch=global_batch, fit=full)
    lines = [
        f"## Landscape {landscape_name(spec)}",
        "",
        f"Workload: `{spec['model']}`, seq {spec['seq_len']}, world size {spec['world_size']}, {spec['precision']}, "
        f"CPU ranks, global batch {global_batch} (accumulation derived), estimator budget "
        f"`--gpu-memory {spec['gpu_memory']}` with the default safety margin {Calibration().margin:.0%}. Measured: "
        f"warmup {measured_info.get('warmup')}, {measured_info.get('steps')} timed steps, "
        f"{measured_info.get('rounds')} round(s) (fastest kept); {measured_info.get('note', '')}.",
        "",
        f"Measured with: `python bench/search_efficiency.py --measure --model {spec['model']} --seq-len "
        f"{spec['seq_len']} --world-size {spec['world_size']} --global-batch {global_batch} --precision "
        f"{spec['precision']} --gpu-memory {spec['gpu_memory']} --rounds {measured_info.get('rounds')} --warmup "
        f"{measured_info.get('warmup')} --steps {measured_info.get('steps')}`.",
        "",
        f"{len(points)} configs; {len(feasible)} fit, {len(points) - len(feasible)} cannot fit by the estimator"
        + (f", {len(failed)} measured runs failed" if failed else "")
        + (
            f" ({len(over_now)} of them were measured when an earlier estimate let them fit; today's estimate puts "
            "them over the budget, so a study today prunes them and they are left out of the best)"
            if over_now
            else ""
        )
        + f". Best {best:,.1f} tokens/s; {len(near)} config(s) within {args.within:.0%} (target ≥ {target:,.1f}). "
        f"Noise: {len(noisy)} of {len(measured)} configs had p90 step > 1.5× median.",
        "",
        f"Throughput model on this landscape: Spearman {prior_rho:.3f} with the table's constants (0 runs); "
        f"{model_spearman(full_guide, by_key):.3f} with constants fitted on all {len(measured)} measured configs "
        f"(median in-sample error {full.in_sample_error():.1%}, out-of-sample as runs arrived "
        f"{full.median_error():.1%}). Factors fitted: "
        + ", ".join(f"{k} {v:.3g}" for k, v in full.factors.items())
        + ".",
        "",
        "| config | est. peak MiB | fits | tokens/s | vs best | predicted (table) | predicted (fitted) | step p50 s "
        "| run s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    predicted = {r.suggestion.key: r.prediction.tokens_per_s for r in guide.ranked}
    fitted = {r.suggestion.key: full_guide.predicted_tokens_per_s(r) for r in full_guide.ranked}
    for point in sorted(points, key=lambda p: -(p.tokens_per_s or -1)):
        tokens = (
            f"{point.tokens_per_s:,.1f}"
            if point.tokens_per_s is not None
            else ("—" if not point.fits else point.status)
        )
        versus = f"{point.tokens_per_s / best - 1:+.1%}" if point.tokens_per_s is not None else ""
        table = f"{predicted[point.key]:,.0f}" if point.key in predicted else ""
        refit = f"{fitted[point.key]:,.0f}" if point.key in fitted else ""
        p50 = f"{point.step_p50:.3f}" if point.step_p50 else ""
        run_s = f"{point.duration_s:.1f}" if point.duration_s else ""
        lines.append(
            f"| {point.label} | {point.estimated_peak / 2**20:.2f} | {'yes' if point.fits else 'no'} | {tokens} | "
            f"{versus} | {table} | {refit} | {p50} | {run_s} |"
        )
    samplers = [name.strip() for name in args.samplers.split(",") if name.strip()]
    results: dict[str, dict[str, Any]] = {}
    for name in samplers:
        begin = time.monotonic()
        outcomes = [
            replay(name, seed, space, workload, global_batch, args, by_key, target, prior) for seed in range(args.seeds)
        ]
        counts = [o.runs for o in outcomes]
        walls = [o.wall_s for o in outcomes if o.wall_s is not None]
        complete = all(o.complete for o in outcomes if o.runs is not None)
        rhos = [o.spearman for o in outcomes if o.spearman is not None]
        results[name] = {**describe(counts), "counts": counts, "walls": walls, "rhos": rhos, "complete": complete}
        print(f"{landscape_name(spec)} {name:15s} runs: {counts} ({time.monotonic() - begin:.1f} s)", flush=True)
    lines += [
        "",
        f"Replay: {args.seeds} seeds per method, at most {args.max_asks} asks, no new runs. A repeated config costs "
        "nothing; 'not reached' counts as infinite in the median and p90 and is left out of the mean. Wall: the "
        "measured seconds of the runs a seed spent until the target (median over the seeds that reached it; each "
        "run's own wall time as the landscape recorded it; '≥': a lower bound, as out-of-memory runs of the "
        "methods without pruning have no recorded time; n/a: the landscape kept no run times). "
        f"Spearman: the refitted model's ranking of every measured config after {SPEARMAN_AFTER} measured runs "
        "(median and minimum over seeds that got that far).",
        "",
        "| method | what | reached | median runs | mean runs | p90 runs | min | max | median wall s | "
        f"Spearman after {SPEARMAN_AFTER} (median / min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, stats in results.items():
        wall = "n/a"
        if stats["walls"] and any(stats["walls"]):
            wall = ("" if stats["complete"] else "≥ ") + f"{statistics.median(stats['walls']):.0f}"
        rho = f"{statistics.median(stats['rhos']):.3f} / {min(stats['rhos']):.3f}" if stats["rhos"] else ""
        lines.append(
            f"| {name} | {NOTES.get(name, '')} | {stats['reached']}/{args.seeds} | {fmt(stats['median'])} | "
            f"{fmt(stats['mean'])} | {fmt(stats['p90'])} | {fmt(stats['min'])} | {fmt(stats['max'])} | {wall} | "
            f"{rho} |"
        )
    for guided in ("tpe-model",):
        if guided in results:
            base = results[guided]["median"]
            lines += ["", f"Ratios of median measured runs to {guided}'s:", ""]
            lines += [
                f"* {name} / {guided}: {ratio(results[name]['median'], base)}" for name in results if name != guided
            ]
    lines += ["", "Runs to target by seed:", ""]
    lines += [f"* {name}: {results[name]['counts']}" for name in results]
    summary = f"| {landscape_name(spec)} | " + " | ".join(
        fmt(results[name]["median"]) if name in results else "" for name in SUMMARY
    )
    guided = results.get("tpe-model", {})
    rho = f"{statistics.median(guided['rhos']):.3f}" if guided.get("rhos") else ""
    versus = [
        ratio(results[name]["median"], guided["median"])
        for name in ("grid-full", "random")
        if guided and name in results
    ]
    return lines, f"{summary} | {' / '.join(versus)} | {rho} | {prior_rho:.3f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure the workload below into a landscape first")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--gpu-memory", default="28MiB", help="the per-rank budget the estimator judges configs by")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--max-asks", type=int, default=200)
    parser.add_argument("--within", type=float, default=0.02, help="target: best-so-far >= (1 - within) x best")
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--db", type=Path, default=HERE / "results" / "landscape.db")
    parser.add_argument("--remeasure", action="store_true", help="measure every config again")
    parser.add_argument(
        "--rounds", type=int, default=2, help="measurements per config, round-robin; the fastest counts"
    )
    parser.add_argument(
        "--landscapes",
        type=Path,
        nargs="*",
        default=None,
        help="landscape JSON files to replay side by side (default: every file in bench/results/landscapes/)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "search_efficiency.md")
    args = parser.parse_args()
    total_started = time.monotonic()
    space = build_space()
    if args.measure:
        spec = {
            "model": args.model,
            "seq_len": args.seq_len,
            "world_size": args.world_size,
            "global_batch": args.global_batch,
            "precision": args.precision,
            "gpu_memory": args.gpu_memory,
        }
        workload = workload_of(spec)
        print(f"measuring landscape {landscape_name(spec)}, budget {args.gpu_memory} ({args.db})", flush=True)
        points, _, measured_s = landscape(args, space, workload)
        load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
        info = {
            "warmup": args.warmup,
            "steps": args.steps,
            "rounds": args.rounds,
            "note": f"{measured_s:.0f} s of measured runs; load average after (1/5/15 min) {load} on "
            f"{os.cpu_count()} CPUs",
        }
        save_landscape(HERE / "results" / "landscapes" / f"{landscape_name(spec)}.json", spec, info, points)
    paths = args.landscapes or sorted((HERE / "results" / "landscapes").glob("*.json"))
    loaded = [(path, *load_landscape(path, space)) for path in paths]
    lines = [
        f"# Search efficiency: measured runs to within {args.within:.0%} of the best config (CPU landscapes, replayed)",
        "",
        "Space: ZeRO stage {0,1,2,3} × micro-batch {1,2,4,8} × activation checkpointing {false,true} at a fixed "
        "global batch (32 configs), everything else pinned. Each landscape was measured once on real DeepSpeed CPU "
        "ranks and is kept in `bench/results/landscapes/` as JSON; the methods are replayed against it.",
        "",
    ]
    replay_started = time.monotonic()
    sections: list[str] = []
    rows: list[str] = []
    for index, (_, spec, info, points) in enumerate(loaded):
        others = [(o_spec, o_points) for j, (_, o_spec, _, o_points) in enumerate(loaded) if j != index]
        prior = fit_over(space, others)
        body, row = section(args, space, spec, info, points, prior)
        sections += [*body, ""]
        rows.append(row)
    replay_s = time.monotonic() - replay_started
    lines += [
        f"Median measured runs to within {args.within:.0%} of the best over {args.seeds} seeds (details per landscape "
        "below). tpe-model's first runs are the model's and do not depend on the seed, so its seeds mostly agree.",
        "",
        "| landscape | " + " | ".join(SUMMARY) + " | grid-full / random ÷ tpe-model | "
        f"Spearman after {SPEARMAN_AFTER} runs (tpe-model) | Spearman, table constants |",
        "|---" * (len(SUMMARY) + 4) + "|",
        *rows,
        "",
        *sections,
    ]
    measured_arg = (
        f" --measure --model {args.model} --seq-len {args.seq_len} --world-size {args.world_size} "
        f"--global-batch {args.global_batch} --gpu-memory {args.gpu_memory} --rounds {args.rounds} "
        f"--warmup {args.warmup} --steps {args.steps}"
        if args.measure
        else ""
    )
    lines += [
        f"Replay time {replay_s:.0f} s; whole bench {time.monotonic() - total_started:.0f} s this invocation.",
        "",
        f"Run: `PYTHONPATH=$PWD python bench/search_efficiency.py --seeds {args.seeds}{measured_arg}` "
        "(with `TORCH_EXTENSIONS_DIR` and `DS_ACCELERATOR=cpu` set when measuring).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
