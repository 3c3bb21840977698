"""Measured runs a sampler needs to get within 2 % of the best config: TPE with estimator pruning vs random vs grid.

1. The landscape: every config of a small space (ZeRO stage × micro-batch × activation checkpointing at a fixed
   global batch, everything else pinned) is judged by the estimator against ``--gpu-memory`` with the default safety
   margin. Configs that cannot fit are recorded as pruned; every other one is measured ONCE on real DeepSpeed CPU
   ranks (``run_measurement``, local launcher). All of it lands in SQL (``tuner.storage``, one study called
   ``landscape-<workload fingerprint>``); a rerun reuses what is stored unless ``--remeasure``.
2. The replay: each sampler runs ``--seeds`` times against the stored landscape (no new runs), through the same
   ask → suggest → config key → estimate → tell steps as ``tuner.study``, with ``tuner.study.make_sampler``'s samplers:

   * ``tpe``: TPE (multivariate, seeded) with estimator pruning: a config that cannot fit costs no run (its trial is
     told PRUNED with a positive ``memory`` constraint), as in the tuning loop.
   * ``random``: random search without pruning: a config that cannot fit costs a run (an out-of-memory failure on
     the target GPU) and yields nothing (told FAIL, constraint 1).
   * ``grid``: the tuning loop's DeepSpeed-autotuner-like baseline, a GridSampler over stage × micro-batch (the
     other parameters at their defaults, so no activation checkpointing) in a seeded shuffled order, without pruning.
   * ``grid-full`` and ``tpe-nopruning`` (references): the grid over all three searched parameters, shuffled; TPE
     whose infeasible configs cost a run like random's.

   A config proposed again costs nothing for any sampler (the study never runs a config twice; the earlier outcome is
   told again). A replay stops once its best measured throughput is within ``--within`` of the landscape's best, when
   every config it can propose has been tried, or after ``--max-asks`` asks; the count is its measured runs then.

Run: ``TORCH_EXTENSIONS_DIR=.cache/torch_extensions DS_ACCELERATOR=cpu .venv/bin/python bench/search_efficiency.py``
(writes ``bench/results/search_efficiency.md``; the landscape database ``bench/results/landscape.db`` stays out of git).
"""

from __future__ import annotations

import argparse
import itertools
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
from tuner.measure.measurement import percentile
from tuner.measure.run import run_measurement
from tuner.space import InfeasibleConfig, SearchSpace, Suggestion, parse_space
from tuner.storage import RETRYABLE_STATUSES, Store, TrialRecord, TrialRow
from tuner.study import GRID_PARAMETERS, StudySettings, capacity_reason, make_sampler
from tuner.study.calibration import Calibration
from tuner.units import parse_bytes
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_model

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
SAMPLERS = ("tpe", "random", "grid", "grid-full", "tpe-nopruning")
PRUNING = {"tpe": True, "random": False, "grid": False, "grid-full": False, "tpe-nopruning": False}
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
            trial_workload = suggestion.apply_to(workload)
            est = estimate(trial_workload, suggestion.ds_config)
            peak = est.per_gpu["total"] or 0
            constraint = peak * (1 + calibration.margin) / est.gpu_memory - 1
            reason = capacity_reason(est, calibration)
            params = dict(suggestion.params)
            if stored is None:
                trial_id = store.add_trial(
                    study.id,
                    number,
                    suggestion.key,
                    suggestion.ds_config,
                    params,
                    suggestion.activation_checkpointing,
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
            pending.append((trial_id, suggestion, trial_workload, number))
        # Every config is measured --rounds times, round-robin, and keeps its fastest run: a burst of load from
        # other processes then slows one run of each config, not every run of the configs measured during it.
        best: dict[int, Any] = {}
        measuring = time.monotonic()
        for round_number in range(args.rounds):
            for trial_id, suggestion, trial_workload, _ in pending:
                run = run_measurement(
                    trial_workload, suggestion.ds_config, launcher="local", warmup=args.warmup, steps=args.steps
                )
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
        duration_s=record.duration_s,
    )


def replay(
    sampler_name: str,
    seed: int,
    space: SearchSpace,
    workload: Workload,
    args: argparse.Namespace,
    by_key: dict[str, Point],
    target: float,
) -> int | None:
    """Measured runs until the best-so-far reaches ``target`` (None: never within the ask budget or the space)."""
    settings = StudySettings(
        name=f"replay-{sampler_name}-{seed}",
        workload=workload,
        space_path=HERE / "search_efficiency.py",
        global_batch=args.global_batch,
        sampler=sampler_name.split("-")[0],
        seed=seed,
    )
    if sampler_name == "grid":
        trial_space = space.restricted(list(GRID_PARAMETERS))
        sampler = make_sampler("grid", trial_space, settings)
    elif sampler_name == "grid-full":
        trial_space = space
        grid = space.grid(global_batch=args.global_batch, world_size=workload.cluster.world_size)
        sampler = optuna.samplers.GridSampler(grid, seed=seed)
    else:
        trial_space = space
        sampler = make_sampler(settings.sampler, space, settings)
    reachable = len(enumerate_configs(trial_space, workload, args.global_batch))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    pruning = PRUNING[sampler_name]
    seen: dict[str, tuple[TrialState, float | None, float]] = {}
    runs, best = 0, -math.inf
    for _ in range(args.max_asks):
        trial = study.ask()
        try:
            suggestion = trial_space.suggest(trial, workload, args.global_batch)
        except InfeasibleConfig:  # not expected in this space: every micro-batch offered divides the global batch
            trial.set_constraint("memory", 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        point = by_key[suggestion.key]
        if suggestion.key not in seen:
            if point.fits and point.tokens_per_s is not None:
                runs += 1
                seen[suggestion.key] = (TrialState.COMPLETE, point.tokens_per_s, point.constraint)
                best = max(best, point.tokens_per_s)
            elif point.fits or not pruning:  # a failed run, or an out-of-memory run the estimator did not stop
                runs += 1
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
        if best >= target:
            return runs
        if len(seen) >= reachable:
            return None
    return None


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--out", type=Path, default=HERE / "results" / "search_efficiency.md")
    args = parser.parse_args()
    total_started = time.monotonic()
    workload = Workload(
        load_model(args.model),
        ClusterSpec(gpus_per_node=args.world_size, device="cpu", gpu_memory=parse_bytes(args.gpu_memory)),
        TrainSpec(seq_len=args.seq_len, precision=args.precision),
    )
    space = build_space()
    print(
        f"landscape: {args.model} seq {args.seq_len} world {args.world_size} global batch {args.global_batch}, "
        f"budget {args.gpu_memory} ({args.db})",
        flush=True,
    )
    points, landscape_s, measured_s = landscape(args, space, workload)
    by_key = {point.key: point for point in points}
    measured = [p for p in points if p.tokens_per_s is not None]
    if not measured:
        raise SystemExit("no config was measured successfully")
    best = max(p.tokens_per_s for p in measured)
    target = (1 - args.within) * best
    near = [p for p in measured if p.tokens_per_s >= target]
    feasible = [p for p in points if p.fits]
    failed = [p for p in points if p.fits and p.tokens_per_s is None]

    noisy = [p for p in measured if p.step_p50 and p.step_p90 and p.step_p90 > 1.5 * p.step_p50]
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [
        f"# Search efficiency: measured runs to within {args.within:.0%} of the best config (CPU landscape, replayed)",
        "",
        f"Workload: `{args.model}`, seq {args.seq_len}, world size {args.world_size}, {args.precision}, CPU ranks, "
        f"global batch {args.global_batch} (accumulation derived), estimator budget `--gpu-memory {args.gpu_memory}` "
        f"with the default safety margin {Calibration().margin:.0%}. Measured runs: warmup {args.warmup}, "
        f"{args.steps} timed steps, local launcher; throughput from the median step.",
        "",
        f"Space: ZeRO stage {{0,1,2,3}} × micro-batch {{1,2,4,8}} × activation checkpointing {{false,true}} = "
        f"{len(points)} configs; {len(feasible)} fit ({len(feasible) / len(points):.0%}), "
        f"{len(points) - len(feasible)} cannot fit by the estimator"
        + (f", {len(failed)} measured runs failed" if failed else "")
        + f". Best {best:,.1f} tokens/s; {len(near)} config(s) within {args.within:.0%} of it "
        f"(the target is ≥ {target:,.1f} tokens/s).",
        "",
        f"Landscape measurement: {measured_s:.0f} s of measured runs ({args.rounds} rounds, round-robin, "
        f"fastest kept); this invocation spent {landscape_s:.0f} s on the landscape (0 when reused). "
        f"Stored in `{args.db.name}` as study `landscape-{workload.fingerprint()}`.",
        "",
        f"Noise check: {len(noisy)} of {len(measured)} measured configs had a p90 step time over 1.5× their median "
        f"(other processes competing for the CPU); load average now (1/5/15 min): {load} on {os.cpu_count()} CPUs. "
        "Load bursts hit one round of a config, not all of them; a landscape still this noisy ranks the moments the "
        "configs were measured as much as the configs.",
        "",
        "## Landscape",
        "",
        "| config | estimated peak MiB | fits | tokens/s | vs best | step p50 s | step p90 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in sorted(points, key=lambda p: -(p.tokens_per_s or -1)):
        tokens = (
            f"{point.tokens_per_s:,.1f}"
            if point.tokens_per_s is not None
            else ("—" if not point.fits else point.status)
        )
        versus = f"{point.tokens_per_s / best - 1:+.1%}" if point.tokens_per_s is not None else ""
        p50 = f"{point.step_p50:.3f}" if point.step_p50 else ""
        p90 = f"{point.step_p90:.3f}" if point.step_p90 else ""
        lines.append(
            f"| {point.label} | {point.estimated_peak / 2**20:.2f} | {'yes' if point.fits else 'no'} | {tokens} | "
            f"{versus} | {p50} | {p90} |"
        )
    print("\n".join(lines[lines.index("## Landscape") :]), flush=True)

    samplers = [name.strip() for name in args.samplers.split(",") if name.strip()]
    results: dict[str, dict[str, Any]] = {}
    replay_started = time.monotonic()
    for name in samplers:
        begin = time.monotonic()
        counts = [replay(name, seed, space, workload, args, by_key, target) for seed in range(args.seeds)]
        results[name] = {**describe(counts), "counts": counts}
        print(f"{name:14s} runs to target by seed: {counts}  ({time.monotonic() - begin:.1f} s)", flush=True)
    replay_s = time.monotonic() - replay_started

    notes = {
        "tpe": "TPE multivariate, estimator pruning (an infeasible config costs 0 runs)",
        "random": "random, no pruning (an infeasible config costs a run)",
        "grid": "grid stage × micro-batch (checkpointing off), seeded shuffle, no pruning",
        "grid-full": "reference: grid over all 32 configs, seeded shuffle, no pruning",
        "tpe-nopruning": "reference: TPE multivariate, no pruning",
    }
    lines += [
        "",
        f"## Replay: {args.seeds} seeds per sampler, at most {args.max_asks} asks, no new runs",
        "",
        "A repeated config costs nothing. 'not reached': the replay tried every config it can propose (or used up "
        "its asks) without getting within the target; such seeds count as infinite in the median and p90 and are left "
        "out of the mean.",
        "",
        "| sampler | what | reached | median runs | mean runs (reached) | p90 runs | min | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, stats in results.items():
        lines.append(
            f"| {name} | {notes.get(name, '')} | {stats['reached']}/{args.seeds} | {fmt(stats['median'])} | "
            f"{fmt(stats['mean'])} | {fmt(stats['p90'])} | {fmt(stats['min'])} | {fmt(stats['max'])} |"
        )
    if "tpe" in results:
        tpe = results["tpe"]["median"]
        lines += ["", "Ratios of median measured runs (same run):", ""]
        for name in ("grid", "random", "grid-full", "tpe-nopruning"):
            if name in results:
                lines.append(f"* {name} / tpe: {ratio(results[name]['median'], tpe)}")
        lines += ["", "Runs to target by seed:", ""]
        lines += [f"* {name}: {results[name]['counts']}" for name in results]
    total_s = time.monotonic() - total_started
    lines += [
        "",
        f"Replay time {replay_s:.0f} s; whole bench {total_s:.0f} s this invocation.",
        "",
        f"Run: `.venv/bin/python bench/search_efficiency.py --gpu-memory {args.gpu_memory}` "
        "(with `TORCH_EXTENSIONS_DIR` and `DS_ACCELERATOR=cpu` set).",
    ]
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[lines.index(next(line for line in lines if line.startswith("## Replay"))) :]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
