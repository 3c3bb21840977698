"""One rank's process on this machine: started in a new session (its own process group, so a hard stop takes
everything it started), forked from the node's fork server or a fresh interpreter, and stopped SIGTERM first.

Each rank is ``python -m tuner.measure.rank.runner RUN_DIR RANK`` (:func:`default_entry`). Lean runs fork it from the
node's fork server, which imported torch and DeepSpeed once (:mod:`tuner.measure.forkserver`); otherwise (or when no
fork server can serve) it is a fresh interpreter. Ranks die with their launcher either way (``PR_SET_PDEATHSIG`` on a
spawned rank; the server stops a forked rank whose launcher's connection closed), so a killed launcher leaves no
orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.measure.driver.places import RankPlace
from tuner.measure.forkserver import ForkedProcess, ForkServerUnavailable, forget_client, node_client
from tuner.measure.run_protocol import SPAWNED_AT, RunSpec

logger = logging.getLogger(__name__)
TERM_GRACE_S = 3.0  # between SIGTERM and SIGKILL when the launcher stops a rank
PR_SET_PDEATHSIG = 1


def default_entry() -> list[str]:
    """The command that runs one rank (followed by RUN_DIR and RANK)."""
    return [sys.executable, "-m", "tuner.measure.rank.runner"]


def _rank_preexec(memory_cap: int | None) -> Callable[[], None]:
    def setup() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if memory_cap:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    return setup


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
    over_memory: tuple[int, int] | None = None  # resident bytes and cap of a rank stopped at its cap (rss_watch)

    def terminate(self, reason: str | None = None, at: float | None = None) -> None:
        """Ask the rank's process group to stop (SIGTERM: the rank unwinds, releasing the build locks it holds);
        ``at`` (wall clock) is when the launcher decided, default now."""
        if self.process.poll() is None:
            if reason:
                self.killed_for = reason
            self.signalled_at = self.signalled_at or at or time.time()
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
    :data:`TERM_GRACE_S` is killed with its whole process group. Every rank is stamped with the one moment the stop
    began: a peer whose collective broke when the first rank went must not have reported before its own stamp."""
    began = time.time()
    for rank in ranks:
        rank.terminate(reason, began)
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
    variables: dict[str, str] | None = None,
    forked: bool = False,
    preload: Sequence[str] = (),
) -> RankProcess:
    """Start the rank at ``place`` in a new session, its output in ``RUN_DIR/rank-N.log``: forked from the node's
    fork server when ``forked`` (:mod:`tuner.measure.forkserver`; ``preload`` names modules it imports first),
    else a fresh interpreter (also when no fork server can serve, which is logged). ``variables`` (the rank's
    launch environment) are set over this process's own."""
    env = dict(os.environ)
    env.update(place.env(master_addr, master_port))
    env.update(variables or {})  # the launch environment (tuner.measure.driver.launch_env.rank_variables)
    env["PYTHONUNBUFFERED"] = "1"
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
