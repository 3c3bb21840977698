"""Estimates per second over a grid of 10,000 ds_configs, in one process (target: 20,000 per second).

The workload is a transformers model (default ``llama-3-8b``; ``--model`` takes any preset or config.json) carrying
its traced profile, as ``dstune estimate`` and studies use it: the profile is built (or read from the cache) once,
before timing, and the per-config work is arithmetic. ``--model-impl builtin`` times the built-in formulas instead.

Then the same workload across world sizes (``--world-sizes``, default 8, 512 and 4,096 ranks, 8 GPUs a node) and ZeRO
stages 1 to 3: estimates/s over the grid's configs of that stage (median of the passes), and the first estimate's time
with the partition caches empty (median), which pays for the partition sizes (:mod:`tuner.estimator.partitions`) as
an API request for a new cluster or a study's first proposal does.

Run: ``.venv/bin/python bench/estimator_speed.py [--model mixtral-8x7b]`` (prints the median of 5 timed passes and
the spread).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from dataclasses import replace

from tuner.estimator import estimate, partitions
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--model-impl", choices=("transformers", "builtin"), default="transformers")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 512, 4096], metavar="N")
    args = parser.parse_args()
    started = time.perf_counter()
    workload = Workload(
        load_model(args.model, implementation=args.model_impl),
        ClusterSpec(gpus_per_node=8, nodes=2),
        TrainSpec(seq_len=4096),
    )
    workload = with_profile(workload, precisions=("bf16", "fp32"))  # the grid trains in both
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
