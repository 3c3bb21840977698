"""A build killed midway (tuner.measure.rank.stale_builds): its lock file, which made every later rank wait until its
run timed out, is removed once no process holds it, and its compilers, left working for a rank that is gone, are
killed; a live build is left alone. Real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner.measure.rank.stale_builds import clear_stale_builds

HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print(fd, flush=True); time.sleep(600)"


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # not this process's child: nothing to reap
        os.waitpid(pid, os.WNOHANG)
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_lock_whose_holder_was_killed_goes_and_a_held_one_stays(tmp_path: Path) -> None:
    op = tmp_path / "cpu_adam"
    op.mkdir()
    lock = op / "lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline()  # it holds the lock, as torch's build does
        assert clear_stale_builds(tmp_path) == (0, 0) and lock.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists() and clear_stale_builds(tmp_path) == (1, 0) and not lock.exists()


def test_compilers_left_by_a_killed_rank_are_killed(tmp_path: Path) -> None:
    op = tmp_path / "deepspeed_shm_comm"
    op.mkdir()
    (op / "lock").touch()
    # a "rank" leading its process group starts a "compiler" in the build folder, then dies
    rank = subprocess.run(
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
        cwd=op,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    compiler = int(rank.stdout.strip())
    try:
        removed, killed = clear_stale_builds(tmp_path)
        assert (removed, killed) == (1, 1)
        deadline = time.monotonic() + 30
        while not _gone(compiler):
            assert time.monotonic() < deadline, "the compiler is still running"
            time.sleep(0.05)
    finally:
        if not _gone(compiler):
            os.kill(compiler, signal.SIGKILL)
