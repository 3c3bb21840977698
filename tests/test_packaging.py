"""A plain wheel works: built from the checkout, installed with ``pip install --target`` outside it, run elsewhere.

The wheel must carry its Alembic migrations and built-in search spaces (package data); ``dstune tune`` from an
unrelated folder then records trials in a fresh SQLite file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DATA = (
    "tuner/space/builtin/default.yaml",
    "tuner/storage/migrations/env.py",
    "tuner/storage/migrations/alembic.ini",
    "tuner/storage/migrations/script.py.mako",
    "tuner/storage/migrations/versions/0001_initial.py",
    "tuner/workload/presets/tiny-gpt2.json",
    "tuner/dashboard/templates/base.html",
)


WHEELS = ROOT / ".cache" / "wheels"  # one installed wheel per state of the sources, shared by both test tiers


def sources_digest() -> str:
    """A digest of what the wheel is built from: pyproject.toml, the README (its long description) and the package."""
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "tuner").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(ROOT)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def build_and_install(target: Path, scratch: Path) -> None:
    """The wheel built from this checkout, installed (without dependencies) into ``target``. Built from a copy of
    what :func:`sources_digest` reads: an in-tree build shares the checkout's ``build/`` folder with any other build
    and reads the package while other processes write its bytecode (a fast-tier build once failed with ``[Errno 2]``
    half-way through copying ``build/lib``)."""
    source, wheels = scratch / "source", scratch / "wheels"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "tuner", source / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("dstune-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """The wheel built from this checkout, installed (without dependencies) into a folder of its own. Built once per
    state of the sources: the fast tier builds it and the slow tier's measured run reuses it (about 14 s a build on a
    loaded 2-core machine); any change to the package, pyproject.toml or the README builds a new one."""
    target = WHEELS / sources_digest()
    if not (target / "tuner").is_dir():
        WHEELS.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="building-", dir=WHEELS))
        try:
            build_and_install(scratch / "site", scratch)
            with contextlib.suppress(OSError):  # another test run installed the same sources first: keep that one
                (scratch / "site").rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    yield target


def _run(target: Path, cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(target), "DS_ACCELERATOR": "cpu"}
    env.pop("DSTUNE_STORAGE", None)
    return subprocess.run(
        [str(target / "bin" / "dstune"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_wheel_carries_migrations_spaces_and_templates(installed: Path) -> None:
    for name in PACKAGE_DATA:
        assert (installed / name).is_file(), f"{name} missing from the wheel"


def test_installed_package_is_the_wheel_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    where = subprocess.run(
        [sys.executable, "-c", "import tuner; print(tuner.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).resolve().is_relative_to(installed.resolve())


def _trials(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT status, prune_reason FROM dstune_trials ORDER BY id").fetchall()


def test_tune_from_an_unrelated_folder_records_pruned_trials(installed: Path, tmp_path: Path) -> None:
    """1 MiB of GPU memory fits nothing without offload: every trial is pruned by the estimator, with its reason."""
    result = _run(
        installed,
        tmp_path,
        "tune", "--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "32", "--device", "cpu",
        "--gpu-memory", "1MiB", "--global-batch", "4", "--trials", "3", "--launcher", "local", "--study", "wheel",
        "--pin", "stage=0", "--pin", "offload_optimizer=none", "--seed", "7",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]  # the study ran, but no config was measured
    assert "Traceback" not in result.stderr
    trials = _trials(tmp_path / "dstune.db")
    assert trials  # repeats of a config are answered from its record, so up to 3
    assert all(status == "pruned" and reason for status, reason in trials)


def test_bad_input_from_the_wheel_is_one_line(installed: Path, tmp_path: Path) -> None:
    result = _run(
        installed, tmp_path, "tune", "--model", "tiny-gpt2", "--seq-len", "64", "--gpus", "1", "--space", "nonexistent"
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "dstune.db").exists() or _trials(tmp_path / "dstune.db") == []


@pytest.mark.deepspeed
def test_tune_from_the_wheel_measures_a_trial(installed: Path, tmp_path: Path) -> None:
    """A measured run from the installed wheel: ranks start as ``python -m tuner.measure.rank.runner`` from it."""
    env_cache = os.environ.get("TORCH_EXTENSIONS_DIR")
    assert env_cache, "conftest sets TORCH_EXTENSIONS_DIR"
    result = _run(
        installed,
        tmp_path,
        "tune", "--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "32", "--device", "cpu",
        "--gpu-memory", "16GiB", "--global-batch", "4", "--trials", "1", "--launcher", "local",
        "--pin", "stage=0", "--pin", "offload_optimizer=none", "--study", "wheel-measured",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    statuses = [status for status, _ in _trials(tmp_path / "dstune.db")]
    assert statuses == ["ok"], (statuses, result.stdout[-2000:])
