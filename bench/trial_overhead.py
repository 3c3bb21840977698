"""What a measured trial costs beyond its timed steps, before and after the per-trial overhead cuts, side by side.

The README's workload (``--model tiny-llama --gpus 2 --seq-len 128 --device cpu --gpu-memory 64MiB --global-batch
16``, the transformers LlamaForCausalLM), a cycle of configs of its space (ZeRO stage 0-2 × micro-batch 1/2/4, the
global batch fixed at 16), each run through the real launcher (``run_measurement``: fresh rank processes) once per
variant, the variants interleaved config by config so that load from elsewhere on the host hits both alike:

* ``before``: ``RunSpec.lean`` off: every rank a fresh interpreter that imports torch, DeepSpeed and transformers.
* ``after``: lean ranks (the default): forked from the node's fork server, which imported all of that once
  (:mod:`tuner.measure.forkserver`), with the start-up and shut-down cuts of :mod:`tuner.measure.lean`.

Prints and writes (``--out``, default ``bench/results/trial_overhead_LAUNCHER.md``) the median per variant of the wall
time, the timed steps, the overhead (wall − timed) and each phase of the trial's cost (:func:`tuner.measure.measurement.
trial_cost`), and the after/before ratio. Every run's status must be ``ok``: a failed run is shown and stops the bench.

Run: ``PYTHONPATH=$PWD DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=... python bench/trial_overhead.py --trials 10``
(``--launcher ray`` runs through a local Ray instead).
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tuner.measure.launcher import launch_local
from tuner.measure.measurement import COST_PHASES, Measurement
from tuner.measure.run_protocol import RunSpec
from tuner.requests import WorkloadRequest, to_workload
from tuner.space.dsconfig import shortcut_config
from tuner.workload import Workload, workload_to_dict

README = {"model": "tiny-llama", "gpus": 2, "seq_len": 128, "device": "cpu", "gpu_memory": "64MiB"}
GLOBAL_BATCH = 16
COLUMNS = ("wall_s", "timed_s", "overhead_s", *[p for p in COST_PHASES if p != "timed_s"], "other_s")


def readme_workload() -> Workload:
    """The README study's workload, built as the CLI builds it."""
    return to_workload(WorkloadRequest.model_validate({**README, "model_impl": "transformers"}), config_name=None)


def configs(workload: Workload) -> list[dict[str, Any]]:
    """Stage 0-2 × micro-batch 1/2/4 at the global batch of 16 (accumulation derived), in the workload's precision."""
    world = workload.cluster.world_size
    return [
        shortcut_config(micro, GLOBAL_BATCH // (micro * world), workload.train.precision, stage, "none", "none")
        for stage, micro in itertools.product((0, 1, 2), (1, 2, 4))
    ]


def run(workload: Workload, config: dict[str, Any], lean: bool, launcher: str) -> Measurement:
    """One trial's measured run as the study's dispatcher makes it (warm-up 2, 3 timed steps; the workload says
    which model implementation trains)."""
    spec = RunSpec(workload_to_dict(workload), config, device="cpu", warmup=2, steps=3, lean=lean)
    if launcher == "ray":
        from tuner.measure.ray_launcher import launch_ray

        return launch_ray(spec, timeout=600.0)
    return launch_local(spec, timeout=600.0)


def median_row(costs: list[dict[str, float]]) -> dict[str, float]:
    """The median of each column over the runs that report it."""
    return {c: statistics.median(cost[c] for cost in costs if c in cost) for c in COLUMNS if any(c in x for x in costs)}


def table(rows: dict[str, dict[str, float]]) -> str:
    """A markdown table: one line per column, the variants' medians and the after/before ratio."""
    lines = ["| seconds (median) | before | after | after/before |", "|---|---:|---:|---:|"]
    before, after = rows["before"], rows["after"]
    for column in COLUMNS:
        if column in before and column in after:
            ratio = after[column] / before[column] if before[column] else float("nan")
            lines.append(f"| {column} | {before[column]:.2f} | {after[column]:.2f} | {ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="runs per variant")
    parser.add_argument("--launcher", choices=("local", "ray"), default="local")
    parser.add_argument("--out", type=Path, help="default bench/results/trial_overhead_LAUNCHER.md")
    args = parser.parse_args(argv)
    workload = readme_workload()
    assert workload.model.implementation == "transformers", "the README's study trains the transformers model"
    cycle = configs(workload)
    costs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    started = time.monotonic()
    for index in range(args.trials):
        config = cycle[index % len(cycle)]
        order = (("before", False), ("after", True)) if index % 2 == 0 else (("after", True), ("before", False))
        for name, lean in order:
            measurement = run(workload, config, lean, args.launcher)
            if measurement.status != "ok":
                print(f"{name} run {index} failed: {measurement.status} {measurement.error}", file=sys.stderr)
                return 1
            costs[name].append(measurement.cost)
            cost = measurement.cost
            print(
                f"{index:2d} {name:6s} wall {cost['wall_s']:6.2f} timed {cost['timed_s']:5.2f} "
                f"overhead {cost['overhead_s']:6.2f}  " + " ".join(f"{p}={cost.get(p, 0):.2f}" for p in COST_PHASES),
                flush=True,
            )
    rows = {name: median_row(runs) for name, runs in costs.items()}
    body = table(rows)
    print(body)
    text = (
        f"# Per-trial overhead: before and after the cuts\n\n"
        f"`PYTHONPATH=$PWD DS_ACCELERATOR=cpu python bench/trial_overhead.py --trials {args.trials} "
        f"--launcher {args.launcher}` on {platform.node()} ({platform.processor() or platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.monotonic() - started:.0f} s in all.\n\n"
        f"The README's workload (tiny-llama, transformers, 2 CPU ranks, seq 128, global batch 16), "
        f"{args.trials} runs per variant over stage 0-2 × micro-batch 1/2/4, variants interleaved. "
        f"`before`: `RunSpec(lean=False)`, fresh rank processes; `after`: lean ranks forked from the node's fork "
        "server (`tuner/measure/forkserver/`, `tuner/measure/lean.py`). "
        f"Slowest rank per phase; overhead = wall − timed.\n\n{body}\n"
    )
    args.out = args.out or Path(f"bench/results/trial_overhead_{args.launcher}.md")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
