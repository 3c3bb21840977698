"""DeepSpeed's CPU shared-memory allreduce segments, removed after a run: named as the installed DeepSpeed names them,
only the run's own, only those written before it ended."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuner.measure.driver.shm_buffers import PREFIX, remove_allreduce_buffers


def test_the_name_is_the_one_the_installed_deepspeed_gives_its_segments() -> None:
    deepspeed = pytest.importorskip("deepspeed")
    source = (Path(deepspeed.__file__).parent / "ops" / "csrc" / "cpu" / "comm" / "shm.cpp").read_text()
    assert f'#define SHM_BUFFER_NAME "{PREFIX}"' in source
    assert '"%s_%d_%s_%s",\n             SHM_BUFFER_NAME,\n             getuid(),' in source  # name, uid, addr, port
    assert 'snprintf(shm_name, NAME_BUF_SIZE, "%s_%d", shm_name_prefix, rank);' in source


def segment(folder: Path, port: int, rank: int, age_s: float = 0.0) -> Path:
    path = folder / f"{PREFIX}_{os.getuid()}_10.0.0.5_{port}_{rank}"
    path.write_bytes(b"\0")
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_only_the_runs_segments_written_before_it_ended_go(tmp_path: Path) -> None:
    mine = [segment(tmp_path, 41000, rank, age_s=5) for rank in (0, 1)]
    other_port = segment(tmp_path, 41001, 0, age_s=5)
    later_run = segment(tmp_path, 41000, 2)  # a later run given the same port: written after ours ended
    other_user = tmp_path / f"{PREFIX}_{os.getuid() + 1}_10.0.0.5_41000_0"
    other_user.write_bytes(b"\0")
    removed = remove_allreduce_buffers(41000, before=time.time() - 1, folder=tmp_path)
    assert sorted(removed) == sorted(path.name for path in mine)
    assert other_port.exists() and later_run.exists() and other_user.exists()


def test_a_rank_host_removes_its_own_ranks_segment_only(tmp_path: Path) -> None:
    zero, one = segment(tmp_path, 41000, 0), segment(tmp_path, 41000, 1)
    assert remove_allreduce_buffers(41000, [1], folder=tmp_path) == [one.name]
    assert zero.exists()
