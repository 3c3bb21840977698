"""The run's collective timeout holds on every process group a rank makes, DeepSpeed's own included (real gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.driver.places import free_port

RANK = Path(__file__).with_name("group_timeout_rank.py")


@pytest.mark.slow
def test_every_group_gets_the_runs_collective_timeout(tmp_path: Path) -> None:
    """Before, the default group had the run's 42 s and ZeRO's cloned world group and a DeepSpeed new_group gloo's
    30-minute default (NCCL's 10 minutes on CUDA)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", DS_ACCELERATOR="cpu")
    done = subprocess.run(
        [sys.executable, str(RANK), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seconds = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(seconds) >= 3 and set(seconds) == {42.0}, seconds
