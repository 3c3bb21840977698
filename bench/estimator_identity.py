"""Every estimate of the benches' configs, field by field, compared between this tree and a previous release's.

A speed-up of the estimator must change no estimate. This bench writes, one JSON line each, every field of the
estimate (:meth:`~tuner.estimator.MemoryEstimate.to_dict` plus each phase's bytes by category and the ``--json``
throughput prediction where the workload is at hand) for:

* ``grid``: ``bench/estimator_speed.py``'s 10,000 configs on its Llama-3-8B workload (2 × 8 GPUs, sequence 4,096),
  and its world-scaling rows (8, 512 and 4,096 ranks, ZeRO 1-3);
* ``true_peak``: the configs of the committed true-peak tables (``estimator_true_peak``, ``sp_true_peak``,
  ``tp_true_peak``, ``ep_true_peak``, ``peft_memory``): each stored measurement's case, estimated as the bench's own
  ``--render`` estimates it;
* ``coverage``: every type ``bench/results/coverage.md`` estimates, its small config at sequence 64 and 512 (at
  most a learned table's positions), fp32 and bf16, micro-batch 2, ZeRO 0-3 on 2 GPUs (the first run traces each
  model: minutes; the profiles are cached, ``DSTUNE_PROFILE_CACHE``).

``--baseline REF`` checks REF out in a temporary git worktree, writes the same lines with REF's tree on
``PYTHONPATH`` (the benches' case lists read from each tree's own ``bench/``), writes them with this tree, and
compares line by line: it prints how many are identical, the first differing fields, and exits 1 on any difference.
``--out FILE`` only writes this tree's lines.

Run: ``.venv/bin/python bench/estimator_identity.py --baseline c787211 [--sets grid,true_peak,coverage]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from baseline_tree import ROOT, tree_env, worktree

SETS = ("grid", "true_peak", "coverage")


def fields(est: Any) -> dict[str, Any]:
    """Every field of an estimate: the ``--json`` object and each phase's bytes by category, device and host."""
    out = est.to_dict()
    out["phase_bytes"] = {name: {"gpu": phase.gpu, "cpu": phase.cpu} for name, phase in est.phases.items()}
    out["activations_known"] = est.activations_known
    return out


def grid_lines() -> Iterator[tuple[str, Any, Any]]:
    """The speed bench's grid on its workload, and its world-scaling rows."""
    from dataclasses import replace

    import estimator_speed

    from tuner.profile import load_model, with_profile
    from tuner.workload import ClusterSpec, TrainSpec, Workload

    base = Workload(load_model("llama-3-8b"), ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=4096))
    base = with_profile(base, precisions=("bf16", "fp32"))
    grid = estimator_speed.config_grid()
    for index, config in enumerate(grid):
        yield f"grid/{index}", base, config
    for world in (8, 512, 4096):
        per_node = 8 if world % 8 == 0 else 1
        sized = replace(base, cluster=replace(base.cluster, gpus_per_node=per_node, nodes=world // per_node))
        for index, config in enumerate(grid):
            if config["zero_optimization"]["stage"]:
                yield f"world{world}/{index}", sized, config


def true_peak_lines() -> Iterator[tuple[str, Any]]:
    """Each stored measurement's case of the true-peak tables, estimated as its bench renders it."""
    import estimator_true_peak as etp

    results = Path(etp.__file__).parent / "results"

    def stored(name: str) -> dict[str, Any]:
        path = results / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    for case_key, data in sorted(stored("estimator_true_peak").items()):
        if data["status"] == "ok":
            name, precision, stage, variant = case_key.split("/")
            config = etp.ds_config(precision, int(stage[1:]), etp.VARIANTS[variant])
            yield f"estimator_true_peak/{case_key}", etp.estimate(etp.workload(name, precision), config)
    for bench in ("sp_true_peak", "tp_true_peak", "ep_true_peak"):
        module = __import__(bench)
        measured = stored(bench)
        for case in module.cases():
            data = measured.get(module.key(case))
            if data is not None and data["status"] == "ok":
                yield f"{bench}/{module.key(case)}", module.estimate_case(case)
    import peft_memory as peft

    from tuner.estimator import estimate

    for case_key in sorted(stored("peft_memory")):
        name, stage, variant = case_key.split("/")
        config = peft.ds_config(int(stage[1:]), peft.VARIANTS[variant])
        yield f"peft_memory/{case_key}", estimate(peft.workload(name, peft.adapter(variant)), config)


def coverage_lines(root: Path) -> Iterator[tuple[str, Any, Any]]:
    """The types coverage.md estimates, at its sequences and precisions, ZeRO 0-3 on 2 GPUs."""
    from dataclasses import replace

    import coverage as cov_bench  # bench/coverage.py (imports torch and transformers)

    from tuner.profile import load_model, with_profile
    from tuner.profile.hf import quiet
    from tuner.workload import ClusterSpec, TrainSpec, Workload

    table = (Path(cov_bench.__file__).parent / "results" / "coverage.md").read_text().splitlines()
    rows = [line.split("|") for line in table if line.count("|") > 4 and "| estimated |" in line]
    attentions = {row[1].strip(): row[3].split("; ")[1] for row in rows}  # the attention the table traced
    for model_type, attention in attentions.items():
        values = {k: v for k, v in cov_bench.shrunk_config(model_type).items() if k != "model_type"}
        with quiet():
            cov_bench.transformers.AutoConfig.for_model(model_type, **values).save_pretrained(root / model_type)
        model = load_model(str(root / model_type / "config.json"))
        limit = model.position_limit
        seqs = sorted({min(seq, limit) if limit else seq for seq in cov_bench.SEQS})
        longest = Workload(model, ClusterSpec(gpus_per_node=2), TrainSpec(seq_len=seqs[-1], attention=attention))
        traced = with_profile(longest, precisions=cov_bench.PRECISIONS, checkpointing=(False,), lengths=seqs)
        for seq in seqs:
            for precision in cov_bench.PRECISIONS:
                work = replace(traced, train=TrainSpec(seq_len=seq, precision=precision, attention=attention))
                for stage in range(4):
                    config = {
                        "train_micro_batch_size_per_gpu": cov_bench.BATCH,
                        "zero_optimization": {"stage": stage},
                        **({"bf16": {"enabled": True}} if precision == "bf16" else {}),
                    }
                    yield f"coverage/{model_type}/{seq}/{precision}/z{stage}", work, config


def dump(sets: list[str], out: Path) -> None:
    """Write this process's estimates (``tuner`` and ``bench`` as found on its path) to ``out``, one JSON line each."""
    from tuner.estimator import estimate

    try:
        from tuner.estimator import predict
    except ImportError:  # --baseline runs this script on an older tree, whose estimator did not export it yet
        from tuner.estimator.throughput import predict  # type: ignore[no-redef]

    def line(key: str, est: Any, throughput: Any = None) -> str:
        record = {"key": key, "estimate": fields(est)}
        if throughput is not None:
            record["throughput"] = throughput.to_dict()
        return json.dumps(record, sort_keys=True)

    with out.open("w") as file, tempfile.TemporaryDirectory() as scratch:
        if "grid" in sets:
            for key, work, config in grid_lines():
                file.write(line(key, estimate(work, config), predict(work, config)) + "\n")
        if "true_peak" in sets:
            for key, est in true_peak_lines():
                file.write(line(key, est) + "\n")
        if "coverage" in sets:
            for key, work, config in coverage_lines(Path(scratch)):
                file.write(line(key, estimate(work, config), predict(work, config)) + "\n")


def run_dump(tree: Path, sets: list[str], out: Path) -> None:
    """This script's ``--out`` in a child process whose ``tuner`` and ``bench`` modules are ``tree``'s."""
    command = [sys.executable, __file__, "--out", str(out), "--sets", ",".join(sets), "--tree", str(tree)]
    subprocess.run(command, env=tree_env(tree), check=True, cwd=tree)


def compare(baseline: Path, current: Path, show: int = 5) -> int:
    """Print how many lines are identical and the first differences; the number of differing or missing keys."""
    old = {json.loads(line)["key"]: line for line in baseline.read_text().splitlines()}
    new = {json.loads(line)["key"]: line for line in current.read_text().splitlines()}
    common = [key for key in old if key in new]
    differing = [key for key in common if old[key] != new[key]]
    print(
        f"{len(common)} estimates in both, {len(common) - len(differing)} byte-identical, {len(differing)} differ;"
        f" only in the baseline: {len(old.keys() - new.keys())}, only in this tree: {len(new.keys() - old.keys())}"
    )
    for key in differing[:show]:
        print(f"  {key}: {', '.join(_differences(json.loads(old[key]), json.loads(new[key])))[:600]}")
    return len(differing) + len(old.keys() ^ new.keys())


def _differences(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for name in sorted(old.keys() | new.keys()):
            found += _differences(old.get(name), new.get(name), f"{path}.{name}" if path else name)
        return found
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REF", help="a commit or tag to compare with (a temporary worktree)")
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--out", type=Path, help="only write this tree's estimates to FILE")
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = [name for name in args.sets.split(",") if name]
    if unknown := set(sets) - set(SETS):
        parser.error(f"--sets: unknown {', '.join(sorted(unknown))}")
    if args.out:
        sys.path[:0] = [str(args.tree / "bench"), str(args.tree / "tests")]
        dump(sets, args.out)
        return 0
    if not args.baseline:
        parser.error("--baseline REF or --out FILE")
    with tempfile.TemporaryDirectory() as scratch, worktree(args.baseline) as tree:
        old, new = Path(scratch) / "baseline.jsonl", Path(scratch) / "current.jsonl"
        run_dump(tree, sets, old)
        run_dump(ROOT, sets, new)
        return 1 if compare(old, new) else 0


if __name__ == "__main__":
    sys.exit(main())
