"""``--device cuda`` on a machine whose torch sees no GPU: ``tune`` and ``measure`` refuse at once, on one line naming
``device`` with exit code 2, before Ray or any rank starts; ranks sent to a Ray cluster are not refused here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.cli.common import require_local_cuda

torch = pytest.importorskip("torch")

DSTUNE = str(Path(sys.executable).with_name("dstune"))
WORKLOAD = ["--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "32", "--device", "cuda"]
REFUSE_WITHIN_S = 60.0  # the CLI's own start on a loaded 2-core host (16 s at load 13); refusing took 139 s before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda is not refused")
@pytest.mark.parametrize(
    "command",
    [
        ["tune", "--storage", "sqlite:///{tmp}/x.db", "--study", "nogpu", "--trials", "1"],  # Ray, the default
        ["measure"],  # the local launcher, the default
    ],
)
def test_cuda_without_a_gpu_is_refused_at_once_on_one_line(tmp_path: Path, command: list[str]) -> None:
    args = [part.format(tmp=tmp_path) for part in command]
    started = time.monotonic()
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}  # a refusal of its own
    done = subprocess.run([DSTUNE, *args, *WORKLOAD], capture_output=True, text=True, timeout=300, env=env)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: device:") and "no GPU" in lines[0], done.stderr
    assert elapsed < REFUSE_WITHIN_S, f"refused after {elapsed:.0f} s"
    assert not list(tmp_path.iterdir())  # nothing was opened: no study, no database


def test_ranks_on_a_ray_cluster_are_not_refused_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster may have GPUs this machine lacks: the address (flag or RAY_ADDRESS) lets the request through."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    require_local_cuda("cuda", "ray", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    require_local_cuda("cuda", "ray", None)
    require_local_cuda("cpu", "local", None)  # cpu is never refused


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda is not refused")
@pytest.mark.parametrize("device_files", [False, True])
def test_no_gpu_is_refused_by_device_files_or_by_torch(monkeypatch: pytest.MonkeyPatch, device_files: bool) -> None:
    """Without a GPU's device files the refusal needs no torch; with them (a driver, no usable GPU) torch decides."""
    import typer

    from tuner.cli import common

    monkeypatch.setattr(common, "gpu_device_files", lambda: device_files)
    with pytest.raises(typer.Exit) as refused:
        require_local_cuda("cuda", "local", "10.0.0.1:6379")  # an address does not help ranks started here
    assert refused.value.exit_code == 2


def test_cuda_with_ds_accelerator_cpu_left_in_the_shell_is_refused_on_one_line(tmp_path: Path) -> None:
    """The ranks inherit DS_ACCELERATOR: with ``cpu`` DeepSpeed would train every 'cuda' run on the CPU."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([DSTUNE, "measure", *WORKLOAD], capture_output=True, text=True, timeout=300, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error: device:") and "DS_ACCELERATOR=cpu" in lines[0], lines


def test_a_memory_cap_on_cuda_is_refused_on_one_line(tmp_path: Path) -> None:
    """RLIMIT_AS breaks cuInit (CUDA reserves the device's address space): every capped CUDA rank failed to start."""
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    ray = ["--launcher", "ray", "--ray-address", "127.0.0.1:1"]  # ranks elsewhere: no local GPU needed to get there
    args = [DSTUNE, "measure", *WORKLOAD, *ray, "--memory-cap", "8GiB"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error: memory-cap:") and "cuInit" in lines[0], lines
