"""The hard cap on a rank's host memory (tuner.measure.driver.rss_watch) and what a run here may take: a real process
past its resident cap is killed and read as ``oom`` / HostMemory; the host's memory is the tighter of the kernel's and
the control group's (tuner.measure.driver.cgroup_memory); CPU ranks default to their share of this host's memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.cli.local_gpu import with_host_share
from tuner.cli.options import WorkloadFlags
from tuner.measure.driver import host_memory
from tuner.measure.driver.cgroup_memory import cgroup_limit
from tuner.measure.driver.host_memory import HOST_MEMORY
from tuner.measure.driver.local_launcher import wait_ranks
from tuner.measure.driver.outcomes import collect_rank
from tuner.measure.driver.processes import RankProcess
from tuner.measure.driver.rss_watch import over_cap, resident
from tuner.measure.measurement import PEER_KILLED

GROWER = "import time\nheld = bytearray({size})\nprint('holding', flush=True)\ntime.sleep(120)\n"


def _rank(tmp_path: Path, rank: int, size: int) -> RankProcess:
    """A real process holding ``size`` bytes resident (bytearray writes every page), as the launcher holds a rank."""
    log = tmp_path / f"rank-{rank}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", GROWER.format(size=size)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return RankProcess(rank, process, log)


def test_a_rank_past_its_resident_cap_is_killed_as_oom(tmp_path: Path) -> None:
    big, small = _rank(tmp_path, 0, 400 * 2**20), _rank(tmp_path, 1, 0)
    wait_ranks([big, small], tmp_path, timeout=120, steps=1, rss_cap=200 * 2**20)  # returns once the cap acted
    assert big.process.returncode is not None and small.process.returncode is not None  # both gone, no wait to 120 s
    result = collect_rank(tmp_path, big)
    assert result.status == "oom" and result.exception_type == HOST_MEMORY
    assert "past its cap of 200.0 MiB" in (result.error or "")
    peer = collect_rank(tmp_path, small)
    assert peer.status == "error" and peer.exception_type == PEER_KILLED


def test_ranks_within_their_cap_are_left_alone(tmp_path: Path) -> None:
    rank = _rank(tmp_path, 0, 0)
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # the watch does not stop it: the timeout does
            rank.process.wait(timeout=0.1)
        wait_ranks([rank], tmp_path, timeout=3, steps=1, rss_cap=2**40)
        assert rank.killed_for == "timeout"
    finally:
        rank.kill()


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_cgroup_v2_limit_is_the_tightest_above_this_process(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slice/job\n")
    root = tmp_path / "fs"
    _write(root / "slice" / "job", {"memory.max": "max\n", "memory.current": "100\n"})
    _write(root / "slice", {"memory.max": "1000\n", "memory.current": "600\n"})
    limit = cgroup_limit(root, proc)
    assert limit is not None and (limit.limit, limit.usage, limit.headroom) == (1000, 600, 400)


def test_cgroup_v1_limit_and_no_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/abc\n0::/\n")
    root = tmp_path / "fs"
    _write(root / "memory", {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "5\n"})
    assert cgroup_limit(root, proc) is None  # v1's "no limit"
    _write(root / "memory" / "docker" / "abc", {"memory.limit_in_bytes": "4096\n", "memory.usage_in_bytes": "1024\n"})
    limit = cgroup_limit(root, proc)
    assert limit is not None and limit.headroom == 3072


def test_available_memory_is_capped_by_the_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.measure.driver.cgroup_memory import CgroupLimit

    monkeypatch.setattr(host_memory, "cgroup_limit", lambda: CgroupLimit(10 * 2**30, 8 * 2**30))
    assert host_memory.available_memory() == int(2 * 2**30 * host_memory.HOST_FRACTION)
    assert host_memory.host_total() == 10 * 2**30
    assert host_memory.rank_share(2) == host_memory.available_memory() // 2


def test_cpu_ranks_default_to_their_share_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "host_total", lambda: 24 * 2**30)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    shared = with_host_share(WorkloadFlags(model="tiny-llama", gpus=2, device="cpu"), "local", None)
    assert shared.gpu_memory == str(12 * 2**30)  # not 80 GiB: a CPU rank's device is the host
    given = WorkloadFlags(model="tiny-llama", gpus=2, device="cpu", gpu_memory="64MiB")
    assert with_host_share(given, "local", None).gpu_memory == "64MiB"
    cluster = WorkloadFlags(model="tiny-llama", gpus=2, device="cpu")
    assert with_host_share(cluster, "ray", "ray://head:10001").gpu_memory is None  # a cluster's hosts, not this one
    gpu = WorkloadFlags(model="tiny-llama", gpus=2, device="cuda")
    assert with_host_share(gpu, "local", None).gpu_memory is None


def test_a_training_command_past_the_host_memory_is_killed_as_oom(tmp_path: Path) -> None:
    from tuner.measure.script import launch
    from tuner.measure.script.readback import read_back
    from tuner.requests import WorkloadRequest, to_workload

    argv = [sys.executable, "-c", GROWER.format(size=400 * 2**20)]
    running = launch.start(argv, str(tmp_path), dict(os.environ), tmp_path, None)
    try:
        launch.wait(running, tmp_path, timeout=120, world=1, steps=1, rss_cap=200 * 2**20)
    finally:
        running.stop(None)
    assert running.killed_for == "host_memory" and running.over_memory is not None
    assert running.leftovers() == []
    workload = to_workload(WorkloadRequest(model="tiny-llama", model_impl="builtin", device="cpu", seq_len=256))
    ended = read_back(
        tmp_path, workload, running.killed_for, running.process.returncode, 120, True, running.over_memory
    )
    assert ended.status == "oom" and ended.exception_type == HOST_MEMORY
    assert "past the 200.0 MiB it had available" in (ended.error or "")


SHARER = (
    "import os, time\nheld = bytearray({size})\nif os.fork() == 0:\n    time.sleep(120)\n    os._exit(0)\n"
    "print('shared', flush=True)\ntime.sleep(120)\n"
)


def test_pages_shared_with_a_fork_count_once_over_them(tmp_path: Path) -> None:
    """A rank whose resident pages it shares with a process it forked (as forked ranks share their fork server's) is
    judged by its proportional share past the cap: half of them here."""
    log = tmp_path / "rank-0.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", SHARER.format(size=300 * 2**20)], stdout=sink, start_new_session=True
        )
    rank = RankProcess(0, process, log)
    try:
        while "shared" not in log.read_text():  # allocated and forked: both map the 300 MiB
            assert process.poll() is None
            time.sleep(0.05)
        assert resident(process.pid) > 250 * 2**20
        assert over_cap([rank], 250 * 2**20) is None  # resident past it, its share (about 150 MiB) within
        over = over_cap([rank], 100 * 2**20)
        assert over is not None and 100 * 2**20 < over[1] < 250 * 2**20
    finally:
        rank.kill()
