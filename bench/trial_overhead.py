"""What a measured trial costs beyond its timed steps, phase by phase and the warm-up part by part, in both launch
environments, this tree against a previous release's in one interleaved run.

The README's workload (``--model tiny-llama --gpus 2 --seq-len 128 --device cpu --gpu-memory 64MiB --global-batch
16``, the transformers LlamaForCausalLM), a cycle of configs of its space (ZeRO stage 0-2 × micro-batch 1/2/4, the
global batch fixed at 16), each run through the real local launcher with lean ranks forked from the node's fork
server (``run_measurement``'s path), in two launch environments:

* ``torchrun`` (``--launcher-env torchrun``, what the README runs): one thread per rank;
* ``deepspeed`` (the default): the deepspeed launcher's rule, torch's default threads, one per physical core for
  every rank: on a 2-core host 2 ranks × 2 threads oversubscribe the cores.

Each tree runs in a child process of its own (its ``tuner`` on ``PYTHONPATH``, its own temporary folder and so its
own fork server; this tree as committed, HEAD, from a temporary worktree too), which first runs one untimed trial
per environment (the fork server's start is the node's, not a trial's); then the trials go config by config,
environment by environment, the trees alternating which goes first, so that load from elsewhere on the host falls
on both alike. ``--baseline REF`` adds REF's tree (a temporary git worktree); ``--fresh`` adds fresh rank processes
of this tree (``RunSpec.lean`` off).

Printed and written (``--out``, default ``bench/results/trial_overhead_local.md``): the median per variant of the wall
time, the timed steps, the overhead (wall − timed), each phase (:data:`tuner.measure.measurement.COST_PHASES`) and the
warm-up's parts (:data:`tuner.measure.measurement.WARMUP_PARTS`; a tree that does not report them shows none), the
ratios, and which launch environment costs what. Every run's status must be ``ok``: a failed run stops the bench.

Run: ``DS_ACCELERATOR=cpu .venv/bin/python bench/trial_overhead.py --trials 6 [--baseline REF] [--fresh]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ENVS = ("torchrun", "deepspeed")
COLUMNS = (
    "wall_s",
    "timed_s",
    "overhead_s",
    "start_s",
    "imports_s",
    "distributed_s",
    "model_s",
    "initialize_s",
    "warmup_s",
    "warmup_first_s",
    "warmup_probe_s",
    "probe_sweeps_s",
    "warmup_gc_s",
    "numerics_s",
    "peak_readback_s",
    "other_s",
)
README = {"model": "tiny-llama", "gpus": 2, "seq_len": 128, "device": "cpu", "gpu_memory": "64MiB"}
GLOBAL_BATCH = 16


def readme_workload(launcher: str = "torchrun") -> Any:
    """The README study's workload, built as the CLI builds it, in ``launcher``'s launch environment."""
    from tuner.requests import WorkloadRequest, to_workload

    request = {**README, "model_impl": "transformers", "launch": {"launcher": launcher}}
    return to_workload(WorkloadRequest.model_validate(request), config_name=None)


def configs(workload: Any) -> list[dict[str, Any]]:
    """Stage 0-2 × micro-batch 1/2/4 at the global batch of 16 (accumulation derived), in the workload's precision."""
    from tuner.space.dsconfig import shortcut_config

    world = workload.cluster.world_size
    return [
        shortcut_config(micro, GLOBAL_BATCH // (micro * world), workload.train.precision, stage, "none", "none")
        for stage, micro in itertools.product((0, 1, 2), (1, 2, 4))
    ]


def child(launcher: str) -> None:
    """One tree's runner: each stdin line ``INDEX ENV LEAN`` is one measured run (warm-up 2, 3 timed steps) of the
    cycle's config INDEX in launch environment ENV through ``launcher`` (local or ray), answered as a JSON line:
    status, error, timings, threads."""
    try:
        from tuner.measure.driver.local_launcher import launch_local
    except ModuleNotFoundError:  # a baseline tree from before the measure room's rank/driver split
        from tuner.measure.launcher import launch_local  # type: ignore[no-redef]
    from tuner.measure.run_protocol import RunSpec
    from tuner.workload import workload_to_dict

    workloads = {env: readme_workload(env) for env in ENVS}
    cycle = configs(workloads["torchrun"])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        index, env, lean = line.split()
        workload = workloads[env]
        spec = RunSpec(
            workload_to_dict(workload),
            cycle[int(index) % len(cycle)],
            device="cpu",
            warmup=2,
            steps=3,
            lean=lean == "1",
        )
        if launcher == "ray":
            try:
                from tuner.measure.driver.ray_launcher import launch_ray
            except ModuleNotFoundError:  # a baseline tree from before the rank/driver split
                from tuner.measure.ray_launcher import launch_ray  # type: ignore[no-redef]

            run = launch_ray(spec, timeout=900.0)
        else:
            run = launch_local(spec, timeout=900.0)
        threads = [rank.launch.get("threads") for rank in run.ranks] if run.ranks else []
        answer = {"status": run.status, "error": (run.error or "")[-800:], "timings": run.timings, "threads": threads}
        print(json.dumps(answer), flush=True)
    from tuner.measure.forkserver import release_node_servers

    release_node_servers()  # the fork servers leave now, not after their idle timeout


class Tree:
    """A child process running trials with one tree's code."""

    def __init__(self, name: str, path: Path, scratch: Path, launcher: str) -> None:
        temp = scratch / name
        temp.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(path / "bench")]), "TMPDIR": str(temp)}
        command = [sys.executable, __file__, "--child", "--launcher", launcher]
        self.name = name
        self.proc = subprocess.Popen(  # in the tree: ranks and fork servers start with ``-m``, from the cwd
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=path
        )
        assert self.proc.stdout is not None
        json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        """End the child (it releases its fork servers), killing it if it does not end."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def run(self, index: int, env: str, lean: bool = True) -> dict[str, Any]:
        """One measured run; stops the bench when it failed."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{index} {env} {int(lean)}\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if answer["status"] != "ok":
            raise SystemExit(f"{self.name} {env} run {index} failed: {answer['status']} {answer['error']}")
        return answer


def cost_of(timings: dict[str, float]) -> dict[str, float]:
    """The columns of one run: the phases, the warm-up's parts, wall, overhead (wall − timed) and other_s (wall −
    the phases; the warm-up's parts are inside warmup_s, the read-back is outside every phase)."""
    from tuner.measure.measurement import trial_cost

    cost = trial_cost(timings)
    cost.update({part: timings[part] for part in COLUMNS if part in timings and part not in cost})
    return cost


def measure(args: argparse.Namespace, trees: list[Tree]) -> dict[str, list[dict[str, float]]]:
    """Every variant's runs, interleaved: config by config, environment by environment, trees alternating."""
    runs: dict[str, list[dict[str, float]]] = {}
    for tree, env in itertools.product(trees, ENVS):
        tree.run(0, env)  # the fork server's start and the first ops' loading: the node's cost, not a trial's
    for index in range(args.trials):
        order = trees if index % 2 == 0 else trees[::-1]
        for env in ENVS:
            for tree in order:
                answer = tree.run(index, env)
                runs.setdefault(f"{tree.name} {env}", []).append(cost_of(answer["timings"]))
                runs.setdefault(f"threads {env}", [{"threads": float(max(answer["threads"] or [0]))}])
                cost = runs[f"{tree.name} {env}"][-1]
                print(
                    f"{index:2d} {tree.name:8s} {env:9s} wall {cost['wall_s']:6.2f} timed {cost['timed_s']:5.2f} "
                    f"overhead {cost['overhead_s']:6.2f} warm-up {cost.get('warmup_s', 0):5.2f}",
                    flush=True,
                )
            if args.fresh:
                answer = trees[-1].run(index, env, lean=False)
                runs.setdefault(f"fresh {env}", []).append(cost_of(answer["timings"]))
    return runs


def table(medians: dict[str, dict[str, float]], names: list[str]) -> str:
    """A markdown table: one line per column, a column per variant, and current/baseline ratios where both ran."""
    ratios = [env for env in ENVS if f"baseline {env}" in medians]
    head = [*names, *(f"current/baseline {env}" for env in ratios)]
    lines = ["| seconds (median) | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for column in COLUMNS:
        if not any(column in medians[name] for name in names):
            continue
        cells = [f"{medians[name][column]:.2f}" if column in medians[name] else "" for name in names]
        for env in ratios:
            old, new = medians[f"baseline {env}"].get(column), medians[f"current {env}"].get(column)
            cells.append(f"{new / old:.2f}" if old and new is not None else "")
        lines.append(f"| {column} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def launch_cause(medians: dict[str, dict[str, float]], threads: dict[str, float]) -> str:
    """Which launch environment costs what, in words (the current tree's medians)."""
    ours, theirs = medians["current torchrun"], medians["current deepspeed"]
    cores = os.cpu_count() or 1
    line = (
        f"Launch environment: under `deepspeed`'s rule each of the 2 ranks ran {threads['deepspeed']:.0f} threads on "
        f"{cores} cores, under `torchrun`'s {threads['torchrun']:.0f}: overhead {theirs['overhead_s']:.2f} s against "
        f"{ours['overhead_s']:.2f} s, warm-up {theirs['warmup_s']:.2f} s against {ours['warmup_s']:.2f} s, "
        f"timed steps {theirs['timed_s']:.2f} s against {ours['timed_s']:.2f} s."
    )
    if threads["deepspeed"] * 2 > cores and theirs["overhead_s"] > 1.5 * ours["overhead_s"]:
        line += (
            f" The launch environment is the cause of {theirs['overhead_s'] - ours['overhead_s']:.2f} s of it: "
            f"{threads['deepspeed'] * 2:.0f} threads oversubscribe {cores} cores (use `--launcher-env torchrun`, "
            "bind cores, or set OMP_NUM_THREADS; docs/launch_env.md)."
        )
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6, help="runs per variant")
    parser.add_argument("--baseline", metavar="REF", help="also run REF's tree (a commit or tag), interleaved")
    parser.add_argument("--fresh", action="store_true", help="also run fresh rank processes of this tree")
    parser.add_argument("--launcher", choices=("local", "ray"), default="local")
    parser.add_argument("--out", type=Path, help="default bench/results/trial_overhead_LAUNCHER.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.launcher)
        return 0
    args.out = args.out or Path(__file__).parent / "results" / f"trial_overhead_{args.launcher}.md"
    from baseline_tree import commit_of, load_line, worktree

    started, loads = time.monotonic(), [load_line()]
    # the current tree runs from a snapshot of HEAD: its fork servers import it as it is when they start, so an
    # edit while the bench runs must not reach them
    with (
        tempfile.TemporaryDirectory() as scratch,
        worktree("HEAD") as head,
        worktree(args.baseline) if args.baseline else nullcontext() as old,
    ):
        trees = [Tree("current", head, Path(scratch), args.launcher)]
        if old is not None:
            trees.insert(0, Tree("baseline", old, Path(scratch), args.launcher))
        try:
            runs = measure(args, trees)
        finally:
            for tree in trees:
                tree.close()
    loads.append(load_line())
    threads = {env: runs.pop(f"threads {env}")[0]["threads"] for env in ENVS}
    medians = {
        name: {c: statistics.median(r[c] for r in rows if c in r) for c in COLUMNS if any(c in r for r in rows)}
        for name, rows in runs.items()
    }
    names = [f"{tree} {env}" for env in ENVS for tree in ("baseline", "current", "fresh") if f"{tree} {env}" in runs]
    body = table(medians, names)
    cause = launch_cause(medians, threads)
    base = f" against `{args.baseline}` ({commit_of(args.baseline)})" if args.baseline else ""
    text = (
        "# Per-trial overhead: phases, the warm-up's parts, both launch environments\n\n"
        f"`DS_ACCELERATOR=cpu .venv/bin/python bench/trial_overhead.py --trials {args.trials} "
        f"--launcher {args.launcher}"
        f"{f' --baseline {args.baseline}' if args.baseline else ''}{' --fresh' if args.fresh else ''}` "
        f"with this tree ({commit_of('HEAD')}){base} on {platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.monotonic() - started:.0f} s in all. Host "
        f"{loads[0]} at the start, {loads[1]} at the end (other work was running: compare within a row).\n\n"
        "The README's workload (tiny-llama, transformers, 2 CPU ranks, seq 128, global batch 16), "
        f"{args.trials} runs per variant over stage 0-2 × micro-batch 1/2/4, lean ranks forked from the node's fork "
        "server, variants interleaved; slowest rank per phase; overhead = wall − timed; the warm-up's parts are "
        "inside warmup_s, peak_readback_s (the true peak read back after warm-up) outside every phase.\n\n"
        f"{body}\n\n{cause}\n"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
