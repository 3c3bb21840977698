"""Start a measured run's ranks as fresh processes on this machine, and never leave one behind.

Each rank is ``python -m tuner.measure.runner RUN_DIR RANK`` in a new session (its own process group), so a hard timeout
kills the rank and everything it started. Ranks also die with their launcher (``PR_SET_PDEATHSIG``), so a killed
launcher leaves no orphans. When one rank fails, its peers would wait in a collective: they get a short grace period,
then they are killed. A rank that exits without writing its result is classified from its exit condition."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.estimator import resolve
from tuner.measure.measurement import CANCELLED, EXCERPT_CHARS, PEER_KILLED, Measurement, RankResult, aggregate
from tuner.measure.runner import RunSpec, progress_path, result_path
from tuner.workload import workload_from_dict

PEER_GRACE_S = 10.0
TERM_GRACE_S = 3.0  # between SIGTERM and SIGKILL when the launcher stops a rank
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
Progress = Callable[[int, int], None]


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_entry() -> list[str]:
    """The command that runs one rank (followed by RUN_DIR and RANK)."""
    return [sys.executable, "-m", "tuner.measure.runner"]


def _rank_preexec(memory_cap: int | None) -> Callable[[], None]:
    def setup() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if memory_cap:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    return setup


@dataclass
class RankProcess:
    """One started rank: its process, its log, and why the launcher killed it (``timeout`` or ``peer``), if it did."""

    rank: int
    process: subprocess.Popen[bytes]
    log: Path
    killed_for: str | None = None
    exited_at: float | None = None

    def terminate(self, reason: str | None = None) -> None:
        """Ask the rank's process group to stop (SIGTERM: the rank unwinds, releasing the build locks it holds)."""
        if self.process.poll() is None:
            if reason:
                self.killed_for = reason
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def kill(self, reason: str | None = None) -> None:
        """Kill the rank's whole process group and reap it."""
        if reason and self.process.poll() is None:
            self.killed_for = reason
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def stop_ranks(ranks: Sequence[RankProcess], reason: str | None = None) -> None:
    """Stop every rank: SIGTERM first, so a rank inside torch's extension build unwinds and releases its lock (a
    SIGKILLed holder leaves the lock behind and every later run waits on it); whatever is left after
    :data:`TERM_GRACE_S` is killed with its whole process group."""
    for rank in ranks:
        rank.terminate(reason)
    deadline = time.monotonic() + TERM_GRACE_S
    for rank in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        rank.kill(reason)


def start_rank(
    run_dir: Path,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    local_rank: int,
    entry: Sequence[str] | None = None,
    memory_cap: int | None = None,
    threads_per_rank: int = 1,
) -> RankProcess:
    """Start rank ``rank`` in a new session, its output in ``RUN_DIR/rank-N.log``."""
    env = dict(os.environ)
    env.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        DSTUNE_THREADS_PER_RANK=str(threads_per_rank),
        PYTHONUNBUFFERED="1",
    )
    log = run_dir / f"rank-{rank}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*(entry or default_entry()), str(run_dir), str(rank)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_rank_preexec(memory_cap),
        )
    return RankProcess(rank, process, log)


def wait_ranks(
    ranks: list[RankProcess],
    run_dir: Path,
    timeout: float,
    steps: int,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Wait for every rank. At ``timeout`` kill them all; once a rank failed (or ``should_stop()`` says a rank
    elsewhere did), kill the rest after a short grace, since they would wait in a collective. When ``cancel`` is set
    (the study was stopped), kill them all at once."""
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    while True:
        codes = [rank.process.poll() for rank in ranks]
        for rank, code in zip(ranks, codes, strict=True):
            if code is not None and rank.exited_at is None:
                rank.exited_at = time.time() - POLL_S  # it ended within the last poll interval
        if all(code is not None for code in codes):
            return
        now = time.monotonic()
        if now >= deadline or (cancel is not None and cancel.is_set()):
            stop_ranks(ranks, "timeout" if now >= deadline else "cancelled")
            return
        if failed_at is None and (any(code not in (None, 0) for code in codes) or (should_stop and should_stop())):
            failed_at = now
        if failed_at is not None and now - failed_at > PEER_GRACE_S:
            stop_ranks(ranks, "peer")
            return
        if progress is not None:
            progress(_steps_done(run_dir, ranks[0].rank), steps)
        time.sleep(POLL_S)


def _steps_done(run_dir: Path, rank: int) -> int:
    try:
        return int(progress_path(run_dir, rank).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-EXCERPT_CHARS:]
    except FileNotFoundError:
        return ""


def collect_rank(run_dir: Path, rank: RankProcess) -> RankResult:
    """The rank's own report, or one made from how its process ended."""
    path = result_path(run_dir, rank.rank)
    if path.exists():
        return RankResult.from_dict(json.loads(path.read_text()))
    code = rank.process.returncode
    if rank.killed_for == "timeout":
        return RankResult(rank.rank, "timeout", error=f"killed at the timeout\n{_tail(rank.log)}")
    if rank.killed_for == "peer":
        return RankResult(rank.rank, "error", exception_type=PEER_KILLED, error="killed after another rank failed")
    if rank.killed_for == "cancelled":
        return RankResult(rank.rank, "error", exception_type=CANCELLED, error="killed: the study was stopped")
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    return RankResult(
        rank.rank, "error", exception_type="ProcessExit", error=f"{how}\n{_tail(rank.log)}", failed_at=rank.exited_at
    )


def launch_local(
    spec: RunSpec,
    timeout: float = 600.0,
    memory_cap: int | None = None,
    entry: Sequence[str] | None = None,
    progress: Progress | None = None,
    keep_dir: Path | None = None,
    cancel: threading.Event | None = None,
) -> Measurement:
    """Run ``spec`` on this machine with one process per rank and return the job's measurement.

    Args:
        spec: what to run; its workload's cluster gives the world size.
        timeout: seconds for the whole run, process start included; then every rank is killed.
        memory_cap: optional address-space limit per rank (bytes), to emulate a smaller memory.
        entry: the rank command (default ``python -m tuner.measure.runner``).
        progress: called with (timed steps done on rank 0, timed steps) while waiting.
        keep_dir: write the run's files there instead of a temporary folder.
        cancel: once set, every rank is killed and the run ends ``error`` / ``Cancelled``.
    """
    workload = workload_from_dict(spec.workload)
    world = workload.cluster.world_size
    threads = max(1, (os.cpu_count() or 1) // world) if spec.device == "cpu" else 1
    with tempfile.TemporaryDirectory(prefix="dstune-run-") as scratch:
        run_dir = keep_dir or Path(scratch)
        run_dir.mkdir(parents=True, exist_ok=True)
        spec.write(run_dir)
        port = free_port()
        started = time.monotonic()
        ranks = [start_rank(run_dir, r, world, "127.0.0.1", port, r, entry, memory_cap, threads) for r in range(world)]
        try:
            wait_ranks(ranks, run_dir, timeout, spec.steps, progress, cancel=cancel)
        finally:
            stop_ranks(ranks)
        results = [collect_rank(run_dir, rank) for rank in ranks]
    measurement = summarize(results, spec)
    measurement.timings["wall_s"] = time.monotonic() - started
    return measurement


def summarize(results: list[RankResult], spec: RunSpec) -> Measurement:
    """Aggregate rank results for ``spec``'s workload."""
    workload = workload_from_dict(spec.workload)
    samples = 0  # throughput is only computed for runs that DeepSpeed accepted and finished
    if all(result.status == "ok" for result in results):
        settings = resolve(workload, spec.ds_config)
        samples = settings.micro_batch * settings.grad_accum * workload.cluster.world_size
    return aggregate(results, workload.model, workload.train.seq_len, samples, workload.cluster.world_size)
