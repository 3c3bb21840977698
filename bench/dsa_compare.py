"""DeepSpeed's autotuner and ``dstune tune`` side by side on the same user script, launcher and host: wall time of
each search, each winner, and each winner confirmed by independent runs measured the same way for both.

The script is ``examples/scripts/raw_deepspeed.py`` (a raw ``deepspeed.initialize`` loop with its own model, data and
loss, the kind of script DeepSpeed's autotuner is written for: it reads ``--deepspeed_config``), launched by the
``deepspeed`` launcher on 2 CPU ranks (gloo), with the user's ds_config ``examples/scripts/ds_config.json`` plus
the autotuner's own ``autotuning`` section. Both tools get the same command and the same file (dstune drops the
``autotuning`` section from what the script gets).

* **DeepSpeed's autotuner** (``deepspeed --autotuning tune``, DeepSpeed 0.19.8): its cheapest mode, ``fast``
  (micro-batch per ZeRO stage only; the full mode also runs a model-based search of ZeRO's other knobs, more
  experiments still), over ZeRO stages 0-3 (``"stage": "all"``) and micro-batches up to ``--max-micro``. What it needs
  on CPU: ``LOCAL_SIZE=2`` (the CPU accelerator's device count, else the NUMA node count, 1: the autotuner sizes its
  slots from it), ``tabulate`` (its ``[autotuning]`` extra) and a free ``--master_port`` (its experiments use that
  port + their number; the default 29500 is often taken on a shared host). Its clean-up after each experiment runs
  ``pdsh ... pkill -f <experiment name>`` on every host; without pdsh (not installed here) that step raises in the
  experiment's thread and is skipped, and the ranks end by themselves (the engine exits after its profiled steps).
* **dstune** (``dstune tune --launcher local ... -- <the same command>``, without ``--model``: the autotuner is told
  nothing of the script's model either), once per cap of ``--trials`` (a study each): configs of the default space
  with the same bounds (ZeRO stage 0-3, micro-batch 1-64, accumulation 1, no offload: the autotuner's fast space),
  the largest micro-batch of each stage first (ZeRO-3 down), stopped by its own rule (``--patience 2``, the default
  for a command) or the cap, then its own confirmation run of the winner (``--confirm``, the default for a
  command), inside its wall time (the figures say the wall time with and without it). Each trial's wall time is
  split into its ranks' phases and the rest (the launcher's start, the stop, the read-back).

Then each winner's ds_config is confirmed by ``--confirm-runs`` independent runs of the same command through
``dstune measure`` (the script's own steps timed from outside the engine, data loading included), the winners
taking turns run by run so that load from elsewhere on the host falls on both alike: medians, and dstune's over the
autotuner's. The autotuner's own figure (its ``throughput`` metric: samples per second from the engine's forward,
backward and step timers, data loading not included) is printed beside its winner as it reported it.

Printed and written (``--out``, default ``bench/results/dsa_compare.md``) with the command that made it and the
host's load.

Run: ``DS_ACCELERATOR=cpu .venv/bin/python bench/dsa_compare.py [--trials 8] [--confirm-runs 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "scripts"
BIN = Path(sys.executable).parent
SEQ_LEN = 64
# no --model: the script's model is its own nn.Module (DSA is told nothing of it either); tokens per sample are read
# from the token ids its forward is given
WORKLOAD = ["--gpus", "2", "--device", "cpu"]
PHASES = ("before_initialize_s", "initialize_s", "warmup_s", "timed_s")  # a trial's own timings (its slowest rank)
PINS = ["grad_accum=1", "offload_optimizer=none", "offload_param=none"]


def command(config: str) -> list[str]:
    """The user's command, as they run it."""
    return ["deepspeed", "--num_gpus", "2", "raw_deepspeed.py", "--deepspeed", "--deepspeed_config", config]


def environment() -> dict[str, str]:
    """The shell both tools run in: this venv's tools first on PATH, CPU ranks, 2 CPU 'devices' for the autotuner."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.update(DS_ACCELERATOR="cpu", LOCAL_SIZE="2")
    return env


def setup(work: Path, max_micro: int) -> None:
    """The script and the user's ds_config with the autotuner's section (ZeRO stage "all": every stage)."""
    shutil.copy(EXAMPLES / "raw_deepspeed.py", work / "raw_deepspeed.py")
    config = json.loads((EXAMPLES / "ds_config.json").read_text())
    config["zero_optimization"] = {"stage": "all"}
    config["autotuning"] = {
        "enabled": True,
        "fast": True,
        "overwrite": True,
        "metric": "throughput",
        "max_train_micro_batch_size_per_gpu": max_micro,
        "results_dir": str(work / "autotuning_results"),
        "exps_dir": str(work / "autotuning_exps"),
    }
    (work / "ds_config.json").write_text(json.dumps(config, indent=2))


def free_port_block(size: int = 64) -> int:
    """A port whose next ``size`` ports were free a moment ago (the autotuner adds each experiment's number)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + size < 65535 and all(_free(port) for port in range(base, base + size)):
            return base
    raise RuntimeError("no block of free ports found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_dsa(work: Path) -> dict[str, Any]:
    """``deepspeed --autotuning tune`` on the command; its wall time, experiments and winner."""
    argv = ["deepspeed", "--autotuning", "tune", "--num_gpus", "2", "--master_port", str(free_port_block())]
    argv += command("ds_config.json")[3:]
    started, load = time.monotonic(), os.getloadavg()[0]
    with (work / "dsa.log").open("wb") as log:
        done = subprocess.run(argv, cwd=work, env=environment(), stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    results = work / "autotuning_results"
    experiments = []
    for exp_dir in sorted(path for path in results.iterdir() if path.is_dir()):
        metrics = exp_dir / "metrics.json"
        figures = json.loads(metrics.read_text()) if metrics.exists() else None
        config = json.loads((exp_dir / "ds_config.json").read_text()) if (exp_dir / "ds_config.json").exists() else {}
        experiments.append(
            {
                "name": exp_dir.name,
                "stage": (config.get("zero_optimization") or {}).get("stage"),
                "micro": config.get("train_micro_batch_size_per_gpu"),
                "throughput": figures.get("throughput") if figures else None,
            }
        )
    optimal = results / "ds_config_optimal.json"
    winner = json.loads(optimal.read_text()) if optimal.exists() else None
    best = max((e for e in experiments if e["throughput"]), key=lambda e: e["throughput"], default=None)
    return {
        "wall_s": wall,
        "load": load,
        "exit": done.returncode,
        "experiments": experiments,
        "winner": winner,
        "best": best,
    }


def run_dstune(work: Path, trials: int) -> dict[str, Any]:
    """``dstune tune --trials N`` on the same command, a study of its own (its confirmation run included); its wall
    time, trials and winner."""
    name, db = f"compare{trials}", f"sqlite:///{work / f'dstune{trials}.db'}"
    pins = [item for pin in PINS for item in ("--pin", pin)]
    argv = [str(BIN / "dstune"), "tune", *WORKLOAD, "--trials", str(trials), "--launcher", "local"]
    argv += ["--storage", db, "--study", name, *pins, "--", *command("ds_config.json")]
    started, load = time.monotonic(), os.getloadavg()[0]
    with (work / f"{name}.log").open("wb") as log:
        done = subprocess.run(argv, cwd=work, env=environment(), stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    settled = "stopped: the best config stood" in (work / f"{name}.log").read_text(errors="replace")
    best_path = work / f"{name}_best.json"
    best = [str(BIN / "dstune"), "best", "--study", name, "--storage", db, "--out", best_path.name]
    subprocess.run(best, cwd=work, env=environment(), capture_output=True, check=False)
    sys.path.insert(0, str(ROOT))
    from tuner.storage import Store

    store = Store.open(db)
    study = store.get_study(name)
    records = store.trials(study.id) if study else []
    winner = store.best_trial(study.id) if study else None
    rows = [
        {
            "number": t.number,
            "status": t.status,
            "stage": t.trial.stage,
            "micro": t.trial.batch[0],
            "tokens_per_s": t.tokens_per_s,
            "stopped_early": bool((t.measurement or {}).get("stopped_early")),
            "phases": _phases(t.measurement or {}),
        }
        for t in records
    ]
    return {
        "trials_asked": trials,
        "wall_s": wall,
        "load": load,
        "settled": settled,
        "exit": done.returncode,
        "trials": rows,
        "winner": json.loads(best_path.read_text()) if best_path.exists() else None,
        "best_tokens_per_s": winner.tokens_per_s if winner else None,
        "confirmation": (winner.measurement or {}).get("confirmation") if winner else None,
    }


def _phases(measurement: dict[str, Any]) -> dict[str, float]:
    """Where a run's wall time went: its ranks' own phases (the slowest rank's), and the rest (the launcher's start,
    the processes' start before dstune's hook is imported, the stop and the read-back)."""
    timings = measurement.get("timings") or {}
    wall = timings.get("wall_s")
    phases = {name: float(timings[name]) for name in PHASES if name in timings}
    if wall:
        phases["wall_s"] = float(wall)
        phases["rest_s"] = float(wall) - sum(phases[name] for name in PHASES if name in phases)
    return phases


def measure(work: Path, config: dict[str, Any], name: str) -> float | None:
    """One independent run of the command with ``config`` through ``dstune measure``: its tokens/s (None: failed)."""
    path = work / f"{name}.json"
    path.write_text(json.dumps(config))
    argv = [str(BIN / "dstune"), "measure", *WORKLOAD, "--launcher", "local", "--json", "--", *command(path.name)]
    done = subprocess.run(argv, cwd=work, env=environment(), capture_output=True, text=True, check=False)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None
    return result.get("tokens_per_s") if result.get("status") == "ok" else None


def confirm(work: Path, winners: dict[str, dict[str, Any]], runs: int) -> dict[str, list[float | None]]:
    """Each winner run ``runs`` times, taking turns (the order rotating round by round)."""
    figures: dict[str, list[float | None]] = {name: [] for name in winners}
    names = list(winners)
    for index in range(runs):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(measure(work, winners[name], f"confirm_{name.replace(' ', '_')}"))
    return figures


def describe(config: dict[str, Any] | None) -> str:
    if not config:
        return "none"
    stage = (config.get("zero_optimization") or {}).get("stage")
    return f"ZeRO-{stage}, micro {config.get('train_micro_batch_size_per_gpu')} × accum " + str(
        config.get("gradient_accumulation_steps")
    )


def median(values: list[float | None]) -> float | None:
    done = [value for value in values if value is not None]
    return statistics.median(done) if done else None


def render(
    dsa: dict[str, Any], studies: list[dict[str, Any]], confirmed: dict[str, list[float | None]], argv: str
) -> str:
    """The results as markdown: the side-by-side table, the ratios, then each tool's runs."""
    names = ["autotuner"] + [_label(ours) for ours in studies]
    medians = {name: median(confirmed[name]) for name in names}
    header = "| | DeepSpeed autotuner (fast) | " + " | ".join(names[1:]) + " |"
    rows = [
        ("wall time of the search", [f"{dsa['wall_s']:.0f} s"] + [_wall(ours, dsa) for ours in studies]),
        (
            "configs run",
            [f"{len(dsa['experiments'])} (its model-info profile run included)"]
            + [
                f"{sum(t['status'] != 'pruned' for t in ours['trials'])} measured, "
                f"{sum(t['status'] == 'pruned' for t in ours['trials'])} pruned, + 1 confirmation"
                + (" (stopped by its rule: the best stood for 2 measured trials)" if ours["settled"] else "")
                for ours in studies
            ],
        ),
        ("winner", [describe(dsa["winner"])] + [describe(ours["winner"]) for ours in studies]),
        (
            "the winner's figure as the tool reported it",
            [f"{_fmt(dsa['best'] and dsa['best']['throughput'])} samples/s (its engine timers)"]
            + [f"{_fmt(ours['best_tokens_per_s'])} tokens/s" for ours in studies],
        ),
        ("dstune's own confirmation run", ["-"] + [_confirmation(ours["confirmation"]) for ours in studies]),
        (
            f"confirmed: median of {len(confirmed['autotuner'])} independent runs (`dstune measure`)",
            [f"{_fmt(medians[name])} tokens/s" for name in names],
        ),
        ("each run", [_runs(confirmed[name]) for name in names]),
    ]
    lines = [
        "# dstune against DeepSpeed's autotuner on the same script",
        "",
        f"Made by `{argv}` on {platform.node() or 'this host'} ({os.cpu_count()} cores, Python "
        f"{platform.python_version()}), load average before and after: {LOAD[0]} / {os.getloadavg()[0]:.2f}.",
        "",
        "The script: `examples/scripts/raw_deepspeed.py` (its own model, data and loss; `deepspeed.initialize` on",
        "`--deepspeed_config`), `deepspeed --num_gpus 2` on 2 CPU ranks (gloo), sequence 64, the user's ds_config",
        "`examples/scripts/ds_config.json` with the autotuner's `autotuning` section (fast mode, ZeRO stage `all`,",
        "micro-batch up to 64). dstune searched the same bounds (stage 0-3, micro-batch 1-64, accumulation 1, no",
        "offload), one study per budget, without `--model` (the autotuner is told nothing of the model either):",
        "nothing pruned before a run, the largest micro-batch of each stage first (ZeRO-3 down), `--trials` a cap and",
        "its own rule (`--patience 2`, the default for a command) stopping it. Load average when each tool started: "
        f"autotuner {dsa['load']:.1f}, " + ", ".join(f"{_label(ours)} {ours['load']:.1f}" for ours in studies) + ".",
        "",
        header,
        "|---" * (len(names) + 1) + "|",
        *(f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows),
        "",
    ]
    for ours in studies:
        mine, theirs = medians[_label(ours)], medians["autotuner"]
        ratio = f"**{mine / theirs:.2f}×** the autotuner's" if mine and theirs else "not comparable (a failed run)"
        search = ours["wall_s"] - ((ours["confirmation"] or {}).get("wall_s") or 0.0)
        lines.append(
            f"- {_label(ours)}: confirmed winner {ratio}, in **{ours['wall_s'] / dsa['wall_s']:.2f}×** its wall time "
            f"with dstune's own confirmation run, {search / dsa['wall_s']:.2f}× without it."
        )
    lines += ["", "## The autotuner's experiments", "", "| experiment | stage | micro | throughput (samples/s) |"]
    lines += ["|---|---|---|---|"]
    for exp in dsa["experiments"]:
        lines.append(f"| {exp['name']} | {exp['stage']} | {exp['micro']} | {_fmt(exp['throughput'])} |")
    for ours in studies:
        lines += ["", f"## {_label(ours)}: its trials", "", "| trial | status | stage | micro | tokens/s |"]
        lines += ["|---|---|---|---|---|"]
        for trial in ours["trials"]:
            tokens = _fmt(trial["tokens_per_s"]) + (" (stopped early)" if trial["stopped_early"] else "")
            lines.append(f"| {trial['number']} | {trial['status']} | {trial['stage']} | {trial['micro']} | {tokens} |")
        lines += _phase_table(ours, dsa)
    return "\n".join(lines) + "\n"


def _phase_table(ours: dict[str, Any], dsa: dict[str, Any]) -> list[str]:
    """Where each trial's wall time went (seconds), and the autotuner's mean per experiment beside it."""
    names = (*PHASES, "rest_s")
    lines = ["", f"### {_label(ours)}: where each trial's wall time went (seconds)", ""]
    lines += ["| trial | wall | " + " | ".join(name.removesuffix("_s") for name in names) + " |"]
    lines += ["|---" * (len(names) + 2) + "|"]
    for trial in ours["trials"]:
        phases = trial["phases"]
        if "wall_s" in phases:
            cells = [f"{phases[name]:.1f}" if name in phases else "-" for name in ("wall_s", *names)]
            lines.append(f"| {trial['number']} | " + " | ".join(cells) + " |")
    confirmation = (ours["confirmation"] or {}).get("wall_s")
    per_experiment = dsa["wall_s"] / max(len(dsa["experiments"]), 1)
    lines += [
        "",
        f"dstune's confirmation run: {_fmt(confirmation)} s. The autotuner: {per_experiment:.0f} s per experiment on "
        "average (its wall time over its experiments, its own waits between them included).",
    ]
    return lines


def _label(ours: dict[str, Any]) -> str:
    return f"dstune, at most {ours['trials_asked']} trials"


def _wall(ours: dict[str, Any], dsa: dict[str, Any]) -> str:
    return f"{ours['wall_s']:.0f} s ({ours['wall_s'] / dsa['wall_s']:.2f}×, its confirmation run included)"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _runs(values: list[float | None]) -> str:
    return ", ".join("failed" if value is None else f"{value:,.0f}" for value in values)


def _confirmation(data: dict[str, Any] | None) -> str:
    if not data:
        return "none"
    if data.get("status") != "ok":
        return f"{data.get('status')}: {data.get('error')}"
    return f"{data['tokens_per_s']:,.0f} tokens/s, {data['ratio']:.2f}× its trial's"


LOAD = [f"{os.getloadavg()[0]:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[8], help="dstune's budgets (caps), a study each")
    parser.add_argument("--max-micro", type=int, default=64, help="the largest micro-batch either tool tries")
    parser.add_argument("--confirm-runs", type=int, default=3, help="independent runs of each winner")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "dsa_compare.md"))
    parser.add_argument("--work", default=None, help="keep the runs' files here (default: a temporary folder)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="dsa-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    setup(work, args.max_micro)
    print(f"work folder: {work}", flush=True)
    studies = []
    for trials in args.trials:
        studies.append(run_dstune(work, trials))
        print(f"dstune, {trials} trials: {studies[-1]['wall_s']:.0f} s, winner {describe(studies[-1]['winner'])}")
    dsa = run_dsa(work)
    print(f"autotuner: {dsa['wall_s']:.0f} s, winner {describe(dsa['winner'])}", flush=True)
    winners = {"autotuner": dsa["winner"], **{_label(ours): ours["winner"] for ours in studies}}
    if not all(winners.values()):
        raise SystemExit(f"a tool found no winner: see the logs in {work}")
    confirmed = confirm(work, winners, args.confirm_runs)
    given = [arg for index, arg in enumerate(sys.argv[1:]) if "--work" not in (arg, sys.argv[index])]  # no paths
    argv = "DS_ACCELERATOR=cpu .venv/bin/python bench/dsa_compare.py " + " ".join(given)
    text = render(dsa, studies, confirmed, argv.strip())
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
