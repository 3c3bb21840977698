"""Start a measured run's ranks as processes of their own on this machine, and never leave one behind.

Each rank is ``python -m tuner.measure.runner RUN_DIR RANK`` in a new session (its own process group), so a hard timeout
kills the rank and everything it started. Lean runs (the default) fork it from the node's fork server, which imported
torch and DeepSpeed once (:mod:`tuner.measure.forkserver`); otherwise it is a fresh interpreter. Ranks die with their
launcher either way (``PR_SET_PDEATHSIG`` on a spawned rank; the server stops a forked rank whose launcher's
connection closed), so a killed launcher leaves no orphans. When one rank fails, its peers would wait in a collective:
they get a short grace period, then they are killed. A rank that exits without writing its result is classified from
its exit condition; one whose fork server died or stopped answering mid-run is lost infrastructure
(:data:`~tuner.measure.measurement.INFRA_LOST`), which the study measures again, not the config's failure.

Every rank gets the environment torchrun gives (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``) from its :class:`RankPlace`, here and on Ray alike. On this machine
a ``--gpus G --nodes M`` layout is emulated on CPU ranks (rank r is local rank r mod G of node r div G); on CUDA it
needs one node (M nodes' local ranks would share this machine's device indices): use the Ray launcher."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
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
from tuner.measure.forkserver import ForkedProcess, ForkServerUnavailable, forget_client, node_client
from tuner.measure.measurement import (
    CANCELLED,
    EXCERPT_CHARS,
    INFRA_LOST,
    PEER_KILLED,
    STOPPED_EARLY,
    Measurement,
    RankResult,
    StepHook,
    aggregate,
)
from tuner.measure.run_protocol import SPAWNED_AT, RunSpec, read_progress, result_path, timings_path
from tuner.workload import workload_from_dict

logger = logging.getLogger(__name__)
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


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a job runs: its global rank, its node, and its index among the job's ranks on that node.

    ``visible_devices`` is the node's ``CUDA_VISIBLE_DEVICES`` for the job (every rank of a node sees all the node's
    GPUs the job holds and picks its own by ``local_rank``); None leaves the variable as the process found it.
    """

    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    node_id: str | None = None
    hostname: str | None = None
    visible_devices: str | None = None

    def env(self, master_addr: str, master_port: int) -> dict[str, str]:
        """The rank's distributed environment (torchrun's names)."""
        env = {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
        }
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env


def local_places(gpus_per_node: int, nodes: int) -> list[RankPlace]:
    """The layout ``nodes`` × ``gpus_per_node`` on this machine: rank r is local rank r mod G of node r div G."""
    world, host = gpus_per_node * nodes, socket.gethostname()
    return [RankPlace(r, world, r % gpus_per_node, gpus_per_node, r // gpus_per_node, None, host) for r in range(world)]


@dataclass
class RankProcess:
    """One started rank: its process, its log, where it runs, and why the launcher killed it (``timeout`` or
    ``peer``), if it did."""

    rank: int
    process: subprocess.Popen[bytes] | ForkedProcess
    log: Path
    place: RankPlace | None = None
    killed_for: str | None = None
    exited_at: float | None = None
    signalled_at: float | None = None  # wall-clock time of the launcher's first SIGTERM or SIGKILL

    def terminate(self, reason: str | None = None) -> None:
        """Ask the rank's process group to stop (SIGTERM: the rank unwinds, releasing the build locks it holds)."""
        if self.process.poll() is None:
            if reason:
                self.killed_for = reason
            self.signalled_at = self.signalled_at or time.time()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def kill(self, reason: str | None = None) -> None:
        """Kill the rank's whole process group and reap it."""
        if reason and self.process.poll() is None:
            self.killed_for = reason
            self.signalled_at = self.signalled_at or time.time()
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
    place: RankPlace,
    master_addr: str,
    master_port: int,
    entry: Sequence[str] | None = None,
    memory_cap: int | None = None,
    threads_per_rank: int = 1,
    forked: bool = False,
    preload: Sequence[str] = (),
) -> RankProcess:
    """Start the rank at ``place`` in a new session, its output in ``RUN_DIR/rank-N.log``: forked from the node's
    fork server when ``forked`` (:mod:`tuner.measure.forkserver`; ``preload`` names modules it imports first),
    else a fresh interpreter (also when no fork server can serve, which is logged)."""
    env = dict(os.environ)
    env.update(place.env(master_addr, master_port))
    env.update(DSTUNE_THREADS_PER_RANK=str(threads_per_rank), PYTHONUNBUFFERED="1")
    rank = place.rank
    log = run_dir / f"rank-{rank}.log"
    argv = [*(entry or default_entry()), str(run_dir), str(rank)]
    env[SPAWNED_AT] = repr(time.monotonic())  # the rank reports its start-up time against this
    if forked:
        process = _fork_rank(argv, env, log, memory_cap, preload)
        if process is not None:
            return RankProcess(rank, process, log, place)
    with log.open("wb") as sink:
        spawned = subprocess.Popen(
            argv,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_rank_preexec(memory_cap),
        )
    return RankProcess(rank, spawned, log, place)


def _fork_rank(
    argv: list[str], env: dict[str, str], log: Path, memory_cap: int | None, preload: Sequence[str]
) -> ForkedProcess | None:
    """The rank forked by the node's server, retried once on a fresh connection (a server that just went idle);
    None when no server can serve."""
    for attempt in range(2):
        client = None
        try:
            client = node_client(env)
            return client.start(argv, env, log, memory_cap, preload)
        except ForkServerUnavailable as error:
            if client is not None:
                forget_client(client)
            if attempt:
                logger.warning("no fork server (%s): ranks start as fresh processes", error)
    return None


def rank_preloads(spec: RunSpec) -> list[str]:
    """Modules a rank of ``spec`` imports that the fork server does not preload: the transformers model's own."""
    model = spec.workload.get("model", {})
    config = json.loads(model["hf_config"]) if model.get("implementation") == "transformers" else {}
    model_type = str(config.get("model_type", ""))
    if not model_type.isidentifier():
        return []
    return [f"transformers.models.{model_type}.modeling_{model_type}"]


def wait_ranks(
    ranks: list[RankProcess],
    run_dir: Path,
    timeout: float,
    steps: int,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
) -> None:
    """Wait for every rank. At ``timeout`` kill them all; once a rank failed (or ``should_stop()`` says a rank
    elsewhere did), kill the rest after a short grace, since they would wait in a collective. When ``cancel`` is set
    (the study was stopped), kill them all at once. ``on_step`` sees the first rank's timed step times at every poll
    once one finished; when it answers True every rank is stopped at once (``stopped_early``)."""
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    alive_at = time.time()  # when the last poll found every rank not yet seen exited still running
    while True:
        polled_at = time.time()
        codes = [rank.process.poll() for rank in ranks]
        for rank, code in zip(ranks, codes, strict=True):
            if code is not None and rank.exited_at is None:
                # the earliest it can have ended: a loaded host's poll comes late, and a peer whose collective broke
                # when this rank died must not be stamped first and blamed
                rank.exited_at = alive_at
        alive_at = polled_at
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
        times = read_progress(run_dir, ranks[0].rank) if progress or on_step else []
        if progress is not None:
            progress(len(times), steps)
        if on_step is not None and times and failed_at is None and on_step(times):
            stop_ranks(ranks, "stopped_early")
            return
        time.sleep(POLL_S)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-EXCERPT_CHARS:]
    except FileNotFoundError:
        return ""


def placed(result: RankResult, place: RankPlace | None) -> RankResult:
    """``result`` with where its rank ran (node id, hostname, node rank, local rank)."""
    if place is not None:
        result.node_id, result.hostname = place.node_id, place.hostname
        result.node_rank, result.local_rank = place.node_rank, place.local_rank
    return result


def collect_rank(run_dir: Path, rank: RankProcess) -> RankResult:
    """The rank's own report, or one made from how its process ended, with where it ran."""
    return placed(_rank_outcome(run_dir, rank), rank.place)


KILLED_BY_LAUNCHER = frozenset({"timeout", "peer", "cancelled"})


def _rank_outcome(run_dir: Path, rank: RankProcess) -> RankResult:
    path = result_path(run_dir, rank.rank)
    if path.exists():
        report = RankResult.from_dict(json.loads(path.read_text()))
        # an error written after the launcher's signal (e.g. a RecursionError from an import SIGTERM interrupted) says
        # how the rank died, not what the config did: then the launcher's reason wins
        after_signal = rank.signalled_at is not None and path.stat().st_mtime >= rank.signalled_at
        if report.status == "ok" or rank.killed_for not in KILLED_BY_LAUNCHER or not after_signal:
            return report
    code = rank.process.returncode
    if rank.killed_for == "timeout":
        return RankResult(rank.rank, "timeout", error=f"killed at the timeout\n{_tail(rank.log)}")
    if rank.killed_for == "peer":
        return RankResult(rank.rank, "error", exception_type=PEER_KILLED, error="killed after another rank failed")
    if rank.killed_for == "stopped_early":  # its phases up to the timed steps, and the steps it finished
        times = read_progress(run_dir, rank.rank)
        try:
            timings = json.loads(timings_path(run_dir, rank.rank).read_text())
        except (FileNotFoundError, ValueError):
            timings = {}
        timings["timed_s"] = sum(times)
        stopped = RankResult(rank.rank, "ok", exception_type=STOPPED_EARLY, error="stopped early", step_times=times)
        stopped.timings = timings
        return stopped
    if rank.killed_for == "cancelled":
        return RankResult(rank.rank, "error", exception_type=CANCELLED, error="killed: the study was stopped")
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    lost = getattr(rank.process, "lost", None)  # its fork server died (its death signal took the rank) or hung
    if lost is not None:
        why = f"its node's fork server was lost mid-run ({lost}); the rank was {how}"
        return RankResult(rank.rank, "error", exception_type=INFRA_LOST, error=why, failed_at=rank.exited_at)
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
    on_step: StepHook | None = None,
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
        on_step: sees rank 0's timed step times as they finish; True stops the run, which ends ``ok`` with its
            partial figures and ``stopped_early``.
    """
    cluster = workload_from_dict(spec.workload).cluster
    world = cluster.world_size
    if spec.device == "cuda" and cluster.nodes > 1:
        return Measurement(
            status="error",
            exception_type="InvalidLayout",
            error=f"the local launcher runs one node; --nodes {cluster.nodes} on CUDA needs the Ray launcher",
        )
    threads = max(1, (os.cpu_count() or 1) // world) if spec.device == "cpu" else 1
    with tempfile.TemporaryDirectory(prefix="dstune-run-") as scratch:
        run_dir = keep_dir or Path(scratch)
        run_dir.mkdir(parents=True, exist_ok=True)
        spec.write(run_dir)
        port = free_port()
        started = time.monotonic()
        places = local_places(cluster.gpus_per_node, cluster.nodes)
        forked, preload = spec.lean, rank_preloads(spec)
        ranks = [
            start_rank(run_dir, place, "127.0.0.1", port, entry, memory_cap, threads, forked, preload)
            for place in places
        ]
        try:
            wait_ranks(ranks, run_dir, timeout, spec.steps, progress, cancel=cancel, on_step=on_step)
        finally:
            stop_ranks(ranks)
        results = [collect_rank(run_dir, rank) for rank in ranks]
    measurement = summarize(results, spec)
    measurement.set_wall(time.monotonic() - started)
    return measurement


def summarize(results: list[RankResult], spec: RunSpec) -> Measurement:
    """Aggregate rank results for ``spec``'s workload. A rank lost with its node, actor or fork server makes the
    whole run lost (``error`` / :data:`INFRA_LOST`, the cause in the error): its peers' broken collectives follow
    from it."""
    workload = workload_from_dict(spec.workload)
    samples = 0  # throughput is only computed for runs that DeepSpeed accepted and finished
    if all(result.status == "ok" for result in results):
        settings = resolve(workload, spec.trial)
        samples = settings.micro_batch * settings.grad_accum * workload.cluster.world_size
    measurement = aggregate(results, workload.model, workload.train.seq_len, samples, workload.cluster.world_size)
    measurement.stopped_early = any(result.exception_type == STOPPED_EARLY for result in results)
    lost = [result for result in results if result.exception_type == INFRA_LOST]
    if lost:
        measurement.status, measurement.exception_type = "error", INFRA_LOST
        measurement.error = f"rank {lost[0].rank}: {lost[0].error}"
    return measurement
