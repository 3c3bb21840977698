"""The training command run as one process group on this machine, ended whole: no process left behind.

The command starts in a new session (``start_new_session``: its own process group), with ``PR_SET_PDEATHSIG`` so it
dies with dstune and, on CPU runs, an optional address-space cap that every process it starts inherits. Launchers
that start their ranks in sessions of their own (torchrun does) are followed too: every descendant seen while the
run goes on is remembered (pid and start time, so a reused pid is never hit), and stopping the run sends SIGTERM to
the group and to each of them, then SIGKILL to whatever is left after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tuner.measure.driver.host_memory import available_memory
from tuner.measure.driver.processes import _rank_preexec
from tuner.measure.driver.rss_watch import OVER_MEMORY, resident
from tuner.measure.measurement import StepHook
from tuner.measure.run_protocol import read_progress

POLL_S = 0.2
TERM_GRACE_S = 3.0
PEER_GRACE_S = 10.0  # a rank failed: its peers get this long to end before they are taken as hung


@dataclass
class Running:
    """A started command: its process, log, and every descendant seen (pid -> start time)."""

    process: subprocess.Popen[bytes]
    log: Path
    seen: dict[int, float] = field(default_factory=dict)
    killed_for: str | None = None
    over_memory: tuple[int, int] | None = None  # resident bytes and cap when stopped past the host's memory

    def resident(self) -> int:
        """Resident bytes of the command and every descendant seen alive."""
        processes = [self.process.pid, *(process.pid for process in self._alive())]
        return sum(resident(pid) for pid in processes)

    def remember(self) -> None:
        """Note the command's descendants alive now."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.seen[child.pid] = child.create_time()

    def _alive(self) -> list[psutil.Process]:
        alive = []
        for pid, created in self.seen.items():
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        return alive

    def stop(self, reason: str | None, at_once: bool = False) -> None:
        """SIGTERM to the group and every descendant seen, then SIGKILL to what is left (``at_once``: SIGKILL only);
        reap the command."""
        if reason and self.process.poll() is None:
            self.killed_for = reason
        self.remember()
        for sig in (signal.SIGKILL,) if at_once else (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            for process in self._alive():
                with contextlib.suppress(psutil.Error):
                    process.send_signal(sig)
            deadline = time.monotonic() + TERM_GRACE_S
            while time.monotonic() < deadline and (self.process.poll() is None or self._alive()):
                time.sleep(0.05)
            if self.process.poll() is not None and not self._alive():
                break
        self.process.wait()

    def leftovers(self) -> list[int]:
        """Descendants still alive (none after :meth:`stop`)."""
        return [process.pid for process in self._alive()]


def start(argv: list[str], cwd: str, env: dict[str, str], run_dir: Path, memory_cap: int | None) -> Running:
    """Start ``argv`` in ``cwd`` in a new session, its output in ``RUN_DIR/command.log``."""
    log = run_dir / "command.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_rank_preexec(memory_cap),  # dies with dstune; the cap on CPU runs,
        )
    return Running(process, log)


def wait(
    running: Running,
    run_dir: Path,
    timeout: float,
    world: int,
    steps: int,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    rss_cap: int | None = None,
) -> None:
    """Wait for the command; stop it at ``timeout``, when ``cancel`` is set, when ``on_step`` says so, or when a
    rank failed and the rest have not ended after :data:`PEER_GRACE_S` (hung in a collective). Every rank reporting
    its result also ends the wait (a launcher that lingers is stopped). Its processes together holding more than
    ``rss_cap`` bytes resident (default: what this host has available now, :func:`.available_memory`) are killed at
    once (``host_memory``): an estimate that is wrong must not take the host."""
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    rss_cap = rss_cap or available_memory()
    while running.process.poll() is None:
        running.remember()
        held = running.resident()
        if held > rss_cap:
            running.over_memory = (held, rss_cap)
            running.stop(OVER_MEMORY, at_once=True)
            return
        now = time.monotonic()
        if now >= deadline or (cancel is not None and cancel.is_set()):
            running.stop("timeout" if now >= deadline else "cancelled")
            return
        if len(list(run_dir.glob("rank-*.json"))) >= world:
            running.stop(None)
            return
        if failed_at is None and any(run_dir.glob("error-*.json")):
            failed_at = now
        if failed_at is not None and now - failed_at > PEER_GRACE_S:
            running.stop("peer")
            return
        times = read_progress(run_dir, 0) if progress or on_step else []
        if progress is not None:
            progress(len(times), steps)
        if on_step is not None and times and on_step(times):
            running.stop("stopped_early")
            return
        time.sleep(POLL_S)
    running.stop(None)  # the command ended: whatever it left running goes too
