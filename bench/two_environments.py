"""Two dstune virtualenvs on one machine, run in turn: does each reuse its DeepSpeed op builds, or rebuild them?

Runs ``VENV/bin/dstune measure`` (tiny-gpt2, 2 CPU ranks, local launcher) alternately from two virtualenvs, A B A B
..., in two modes, each from an empty cache folder of its own:

- ``own``: ``TORCH_EXTENSIONS_DIR`` unset, the cache at a fresh ``XDG_CACHE_HOME``: each environment builds in the
  folder dstune resolves for it (``tuner.measure.op_builds.extensions_dir``), as README command 1 does;
- ``shared``: ``TORCH_EXTENSIONS_DIR`` set to one folder for both, as torch's own default
  (``~/.cache/torch_extensions/py311_cpu``) is shared by every environment of a user.

For each run: wall seconds, whether dstune printed its "Building DeepSpeed's ... once" line, and which compiled
libraries (``*.so`` under the folders) were written during the run (their modification time changed: the truth of a
rebuild, whatever was printed). The config uses torch's Adam, so a run compiles ``deepspeed_shm_comm`` (and dstune's
counting allocator) only.

    .venv/bin/python bench/two_environments.py VENV_A VENV_B [--rounds 2] [--modes own,shared] [--out FILE]

``--render LOG`` writes the table again from the runs an earlier call printed, one JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NOTICE = "Building DeepSpeed's"
CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    "zero_optimization": {"stage": 1},
}
MEASURE = ["measure", "--model", "tiny-gpt2", "--gpus", "2", "--device", "cpu", "--seq-len", "64", "--launcher"]
MEASURE += ["local", "--launcher-env", "torchrun", "--warmup", "1", "--steps", "2", "--timeout", "3600"]


def libraries(root: Path) -> dict[str, int]:
    """Every compiled library under ``root`` and its modification time (ns)."""
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in root.rglob("*.so")}


def run_once(venv: Path, env: dict[str, str], config: Path, root: Path) -> dict[str, Any]:
    """One ``dstune measure`` from ``venv``: seconds, exit status, the build line, the libraries it wrote."""
    before = libraries(root)
    started = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "dstune"), *MEASURE, "--ds-config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.monotonic() - started
    after = libraries(root)
    written = sorted(name for name, mtime in after.items() if before.get(name) != mtime)
    said = [line for line in done.stdout.splitlines() if line.startswith(NOTICE)]
    return {
        "venv": str(venv),
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "said_building": said[0] if said else None,
        "libraries_written": written,
        "tail": None if done.returncode == 0 else (done.stdout + done.stderr)[-1500:],
    }


def base_env(tmp: Path) -> dict[str, str]:
    """The environment of every run: this one without a virtualenv's or a folder's say, CPU ranks, its own TMPDIR."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TORCH_EXTENSIONS_DIR")}
    (tmp / "tmp").mkdir(exist_ok=True)
    return {**env, "DS_ACCELERATOR": "cpu", "TMPDIR": str(tmp / "tmp")}


def run_mode(mode: str, venvs: list[Path], rounds: int, tmp: Path) -> list[dict[str, Any]]:
    """``rounds`` of the venvs in turn, in ``mode`` (``own`` or ``shared``), from an empty cache."""
    folder = tmp / mode
    folder.mkdir()
    config = tmp / "ds_config.json"
    config.write_text(json.dumps(CONFIG))
    env = base_env(tmp) | {"XDG_CACHE_HOME": str(folder)}
    if mode == "shared":
        env["TORCH_EXTENSIONS_DIR"] = str(folder / "torch_extensions")
    runs = []
    for round_number in range(rounds):
        for venv in venvs:
            run = run_once(venv, env, config, folder)
            runs.append({"mode": mode, "round": round_number + 1, **run})
            print(json.dumps(runs[-1]), flush=True)
    return runs


def anonymous(runs: list[dict[str, Any]], venvs: list[Path]) -> list[dict[str, Any]]:
    """The runs with each virtualenv named ``A`` or ``B`` and the scratch cache's path left out (they are this
    machine's, not the result's)."""
    names = {str(venv): "AB"[index] for index, venv in enumerate(venvs)}
    scratch = re.compile(r"\S*/two-environments-[^/\s]+/")
    cleaned = []
    for run in runs:
        said = run["said_building"] and scratch.sub("<empty cache>/", run["said_building"])
        cleaned.append({**run, "venv": names.get(run["venv"], run["venv"]), "said_building": said})
    return cleaned


def render(runs: list[dict[str, Any]], venvs: list[Path], rounds: int, note: str = "") -> str:
    """The runs (:func:`anonymous`) as a markdown table with the command that made them."""
    lines = [
        "# Two dstune virtualenvs, run in turn",
        "",
        f"`bench/two_environments.py A B --rounds {rounds}`: A and B are two dstune virtualenvs at different paths "
        f"(both torch {_version(venvs[0], 'torch')}, DeepSpeed {_version(venvs[0], 'deepspeed')}), `dstune measure` of "
        "tiny-gpt2 on 2 CPU ranks, torch's Adam (the ops it compiles: `deepspeed_shm_comm`, and dstune's counting "
        "allocator), each mode from an empty cache. *written*: the compiled libraries whose file changed during the "
        "run (the truth of a rebuild); *said*: whether dstune printed its build line.",
        "",
        "| mode | round | env | seconds | said building | libraries written |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        written = ", ".join(f"`{name}`" for name in run["libraries_written"]) or "none"
        said = "yes" if run["said_building"] else "no"
        status = "" if run["exit"] == 0 else f" (exit {run['exit']})"
        row = [run["mode"], run["round"], run["venv"], f"{run['seconds']}{status}", said, written]
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join([*lines, *(["", note] if note else [])]) + "\n"


def _version(venv: Path, package: str) -> str:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("venvs", nargs=2, type=Path, help="two virtualenvs with dstune installed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="own,shared")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    parser.add_argument("--render", type=Path, help="no runs: the runs printed (one JSON a line) by an earlier call")
    parser.add_argument("--note", default="", help="a paragraph after the table (the host, its load)")
    args = parser.parse_args()
    venvs = [venv.absolute() for venv in args.venvs]
    if args.render:
        lines = args.render.read_text().splitlines()
        runs = [json.loads(line) for line in lines if line.startswith("{")]
    else:
        with tempfile.TemporaryDirectory(prefix="two-environments-") as scratch:
            modes = args.modes.split(",")
            runs = [run for mode in modes for run in run_mode(mode, venvs, args.rounds, Path(scratch))]
    runs = anonymous(runs, venvs)
    table = render(runs, venvs, args.rounds, args.note)
    print(table)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
