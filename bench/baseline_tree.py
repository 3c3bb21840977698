"""A previous release's tree beside the current one, for the benches that compare the two in one interleaved run
(``--baseline REF``: ``bench/estimator_speed.py``, ``bench/estimator_identity.py``, ``bench/trial_overhead.py``).
Imported by name: a script's own folder is on its path."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """``ref`` (a commit, tag or branch of this repository) checked out in a temporary git worktree, removed after."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tree"
        done = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"--baseline {ref}: {done.stderr.strip()}")
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def commit_of(ref: str) -> str:
    """The short commit ``ref`` names (``HEAD``: the current tree, ``+changes`` when it has uncommitted ones)."""
    short = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    if ref == "HEAD":
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        short += "+changes" if dirty else ""
    return short


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a child process whose ``tuner`` package (and the benches it imports) are ``tree``'s."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "bench")])}


def load_line() -> str:
    """The host's load average now, to print beside timings (a loaded host slows both trees alike when interleaved)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"
