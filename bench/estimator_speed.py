"""Estimates per second over a grid of 10,000 ds_configs, in one process (target: 20,000 per second).

The workload is a transformers model (default ``llama-3-8b``; ``--model`` takes any preset or config.json) carrying
its traced profile, as ``dstune estimate`` and studies use it: the profile is built (or read from the cache) once,
before timing, and the per-config work is arithmetic. ``--model-impl builtin`` times the built-in formulas instead.

Then the same workload across world sizes (``--world-sizes``, default 8, 512 and 4,096 ranks, 8 GPUs a node) and ZeRO
stages 1 to 3: estimates/s over the grid's configs of that stage (median of the passes), and the first estimate's time
with the partition caches empty (median), which pays for the partition sizes (:mod:`tuner.estimator.states.partitions`)
as
an API request for a new cluster or a study's first proposal does.

Run: ``.venv/bin/python bench/estimator_speed.py [--model mixtral-8x7b]`` (prints the median of 5 timed passes and
the spread).

``--baseline REF`` (a commit or tag, e.g. the previous release) compares instead: REF is checked out in a temporary
git worktree, and two child processes, one per tree (each with its ``tuner`` on ``PYTHONPATH``, the same grid and
profile), time the grid pass by pass, alternating which goes first, so that load from elsewhere on the host falls on
both alike. Printed (and written to ``--out``, default ``bench/results/estimator_speed.md``): the median estimates
per second of each, by wall clock and by the process's CPU time, the current/baseline ratio, the host's load, and
each tree's first pass over the grid with every cache cold (CPU time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from tuner.estimator import estimate
from tuner.profile import load_model, with_profile
from tuner.workload import ClusterSpec, TrainSpec, Workload


def config_grid() -> list[dict]:
    """10,000 configs across every knob the tuner searches."""
    grid = []
    knobs = itertools.product(
        (0, 1, 2, 3),  # stage
        (1, 2, 4, 8, 16),  # micro-batch
        (1, 4),  # accumulation
        ("bf16", "fp32"),
        (True, False),  # overlap_comm
        (10**7, 5 * 10**7, 2 * 10**8, 5 * 10**8, 10**9),  # bucket sizes
        ("none", "cpu"),  # offload optimizer
        (0, 10**5),  # persistence threshold
        (10**8, 10**9),  # max live parameters
        (True, False),  # contiguous gradients
    )
    for stage, micro, accum, precision, overlap, bucket, offload, persist, live, contiguous in knobs:
        zero = {
            "stage": stage,
            "overlap_comm": overlap,
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
            "contiguous_gradients": contiguous,
        }
        if stage:  # the offload knobs follow other axes, keeping the grid at 10,000 configs
            zero["offload_optimizer"] = {"device": offload, "pin_memory": contiguous}
        if stage in (1, 2) and offload == "cpu":
            zero["round_robin_gradients"] = overlap
        if stage == 3:
            zero.update(
                stage3_param_persistence_threshold=persist,
                stage3_max_live_parameters=live,
                stage3_prefetch_bucket_size=bucket // 10,
                offload_param={"device": offload, "pin_memory": overlap},
                stage3_gather_16bit_weights_on_model_save=contiguous,
            )
        config = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accum,
            "zero_optimization": zero,
        }
        if precision == "bf16":
            config["bf16"] = {"enabled": True}
        grid.append(config)
        if len(grid) == 10_000:
            break
    return grid


def clear_partition_caches() -> None:
    """Forget every partition size computed so far, as a fresh process would."""
    from tuner.estimator.states import partitions  # here: a --baseline child runs this script on an older tree

    for cached in (partitions.flat_partition, partitions.stage3_layout, partitions.round_robin_order):
        cached.cache_clear()


def world_scaling(workload: Workload, grid: list[dict], world_sizes: list[int], passes: int = 5) -> None:
    """Print world size × ZeRO stage: estimates/s with warm caches, and the first estimate's time with cold ones."""
    print(f"{'world':>6} {'stage':>5} {'estimates/s':>12} {'first estimate (cold), ms':>26}")
    for world in world_sizes:
        per_node = 8 if world % 8 == 0 else 1
        sized = replace(workload, cluster=replace(workload.cluster, gpus_per_node=per_node, nodes=world // per_node))
        for stage in (1, 2, 3):
            configs = [config for config in grid if config["zero_optimization"]["stage"] == stage]
            cold = []
            for _ in range(passes):
                clear_partition_caches()
                start = time.perf_counter()
                estimate(sized, configs[0])
                cold.append(time.perf_counter() - start)
            rates = []
            for _ in range(passes):
                start = time.perf_counter()
                for config in configs:
                    estimate(sized, config)
                rates.append(len(configs) / (time.perf_counter() - start))
            print(f"{world:>6} {stage:>5} {statistics.median(rates):>12,.0f} {statistics.median(cold) * 1e3:>26.3f}")


def bench_workload(model: str, implementation: str) -> Workload:
    """The grid's workload: ``model`` on 2 nodes of 8 GPUs at sequence 4,096, its profile traced in bf16 and fp32."""
    workload = Workload(
        load_model(model, implementation=implementation), ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=4096)
    )
    return with_profile(workload, precisions=("bf16", "fp32"))  # the grid trains in both


def child(model: str, implementation: str) -> None:
    """One tree's timer: ready once the workload is built and the caches warm (answering the CPU estimates per second
    of that first pass, every cache cold), then for each line on stdin one timed pass of the grid, answered as a JSON
    line (wall and CPU estimates per second)."""
    workload, grid = bench_workload(model, implementation), config_grid()
    cpu = time.process_time()
    for config in grid:
        estimate(workload, config)
    print(json.dumps({"ready": True, "first_cpu": len(grid) / (time.process_time() - cpu)}), flush=True)
    for _ in sys.stdin:
        wall, cpu = time.perf_counter(), time.process_time()
        for config in grid:
            estimate(workload, config)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"wall": len(grid) / wall, "cpu": len(grid) / cpu}), flush=True)


def compare(ref: str, args: argparse.Namespace) -> None:
    """The grid timed in this tree and in ``ref``'s, pass by pass, alternating which goes first; medians, ratios."""
    from baseline_tree import commit_of, load_line, tree_env, worktree

    command = [sys.executable, __file__, "--child", "--model", args.model, "--model-impl", args.model_impl]
    rates: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    loads = [load_line()]
    first: dict[str, float] = {}  # each tree's first pass, caches cold (CPU estimates/s)
    with worktree(ref) as tree:
        trees = {"baseline": tree, "current": Path(__file__).resolve().parents[1]}
        children = {
            name: subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=tree_env(path), cwd=path
            )
            for name, path in trees.items()
        }
        try:
            for name, proc in children.items():
                assert proc.stdout is not None
                ready = json.loads(proc.stdout.readline())
                first[name] = ready.get("first_cpu", 0.0)
            for index in range(args.passes):
                for name in ("baseline", "current") if index % 2 == 0 else ("current", "baseline"):
                    proc = children[name]
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write("pass\n")
                    proc.stdin.flush()
                    rates[name].append(json.loads(proc.stdout.readline()))
        finally:
            for proc in children.values():
                proc.kill()
    loads.append(load_line())
    report(ref, commit_of(ref), commit_of("HEAD"), rates, first, loads, args)


def report(
    ref: str,
    base: str,
    head: str,
    rates: dict[str, list[dict[str, float]]],
    first: dict[str, float],
    loads: list[str],
    args: argparse.Namespace,
) -> None:
    """Print and write the side-by-side medians and the current/baseline ratios."""
    medians = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu")} for name, runs in rates.items()
    }
    spread = {name: (min(r["wall"] for r in runs), max(r["wall"] for r in runs)) for name, runs in rates.items()}
    lines = [
        "| tree | estimates/s (wall, median) | wall min-max | estimates/s (CPU time, median) |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} ({base if name == 'baseline' else head}) | {medians[name]['wall']:,.0f} | "
            f"{spread[name][0]:,.0f}-{spread[name][1]:,.0f} | {medians[name]['cpu']:,.0f} |"
            for name in ("baseline", "current")
        ),
        f"| current / baseline | {medians['current']['wall'] / medians['baseline']['wall']:.2f}x | | "
        f"{medians['current']['cpu'] / medians['baseline']['cpu']:.2f}x |",
    ]
    text = (
        "# Estimator speed against a previous release\n\n"
        f"`.venv/bin/python bench/estimator_speed.py --baseline {ref} --passes {args.passes}` "
        f"({args.model}, {args.model_impl}; 10,000 configs on 2 x 8 GPUs, sequence 4,096), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: the two trees' passes interleaved, "
        f"{args.passes} each. Host {loads[0]} at the start, {loads[1]} at the end: other work was running, "
        "so compare the ratio, not the absolute rates. Target: 20,000 estimates/s.\n\n" + "\n".join(lines) + "\n\n"
        "The timed passes repeat the grid in processes that have estimated it once, as a study re-estimates configs "
        "like those it has seen: every cache is warm. The first pass, every cache cold (each tree's warm-up, both at "
        f"once, so CPU time only): baseline {first['baseline']:,.0f}, current {first['current']:,.0f} estimates/s "
        f"({first['current'] / first['baseline']:.2f}x).\n"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--model-impl", choices=("transformers", "builtin"), default="transformers")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 512, 4096], metavar="N")
    parser.add_argument("--baseline", metavar="REF", help="compare with this commit or tag, interleaved")
    parser.add_argument("--passes", type=int, default=10, help="timed passes per tree with --baseline")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "estimator_speed.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.model_impl)
        return
    if args.baseline:
        compare(args.baseline, args)
        return
    started = time.perf_counter()
    workload = bench_workload(args.model, args.model_impl)
    print(f"model {args.model} ({args.model_impl}): profile ready in {time.perf_counter() - started:.2f} s")
    grid = config_grid()
    estimate(workload, grid[0])  # warm the partition caches once, as a long study does
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        fits = sum(estimate(workload, config).fits for config in grid)
        rates.append(len(grid) / (time.perf_counter() - start))
    print(f"configs: {len(grid)}  fitting: {fits}  activations: {estimate(workload, grid[0]).activations_source}")
    print(
        f"estimates/s: median {statistics.median(rates):,.0f}  min {min(rates):,.0f}  max {max(rates):,.0f}"
        f"  (target 20,000)"
    )
    world_scaling(workload, grid, args.world_sizes)


if __name__ == "__main__":
    main()
