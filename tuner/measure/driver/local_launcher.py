"""Run a measured job's ranks as processes of their own on this machine, and never leave one behind.

:func:`launch_local` writes the run's spec, starts one process per rank (:mod:`tuner.measure.driver.processes`, at the
places :func:`~tuner.measure.driver.places.local_places` gives), waits for them (:func:`wait_ranks`, shared with the Ray
launcher) and collects what their ends say (:mod:`tuner.measure.driver.outcomes`). When one rank fails, its peers would
wait in a collective: they get a short grace period, then they are killed; a hard timeout kills every rank with
everything it started. On this machine a ``--gpus G --nodes M`` layout is emulated on CPU ranks; on CUDA it needs one
node (M nodes' local ranks would share this machine's device indices): use the Ray launcher."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tuner.measure.driver.gpu_lease import TooFewDevices, node_leases
from tuner.measure.driver.host_memory import rank_share
from tuner.measure.driver.launch_env import measured_launch, plan_rank, rank_variables, with_plan
from tuner.measure.driver.outcomes import collect_rank, summarize
from tuner.measure.driver.places import free_port, local_places
from tuner.measure.driver.processes import RankProcess, rank_preloads, start_rank, stop_ranks
from tuner.measure.driver.rss_watch import over_cap, stop_over
from tuner.measure.driver.shm_buffers import remove_allreduce_buffers
from tuner.measure.measurement import Measurement, StepHook
from tuner.measure.oom import cgroup_oom_kills, kills_between
from tuner.measure.run_protocol import RunSpec, read_progress
from tuner.workload import workload_from_dict

PEER_GRACE_S = 10.0
POLL_S = 0.2
Progress = Callable[[int, int], None]


def wait_ranks(
    ranks: list[RankProcess],
    run_dir: Path,
    timeout: float,
    steps: int,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    rss_cap: int | None = None,
) -> None:
    """Wait for every rank. At ``timeout`` kill them all; once a rank failed (or ``should_stop()`` says a rank
    elsewhere did), kill the rest after a short grace, since they would wait in a collective. When ``cancel`` is set
    (the study was stopped), kill them all at once. ``on_step`` sees the first rank's timed step times at every poll
    once one finished; when it answers True every rank is stopped at once (``stopped_early``). A rank holding more
    than ``rss_cap`` bytes resident (default: its share of this host's memory, :func:`.rank_share`, ``ranks`` all
    here) is killed at once, its peers after it (:mod:`tuner.measure.driver.rss_watch`)."""
    rss_cap = rss_cap or rank_share(len(ranks))
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
        over = over_cap(ranks, rss_cap)
        if over is not None:
            stop_over(ranks, *over, rss_cap)
            return
        times = read_progress(run_dir, ranks[0].rank) if progress or on_step else []
        if progress is not None:
            progress(len(times), steps)
        if on_step is not None and times and failed_at is None and on_step(times):
            stop_ranks(ranks, "stopped_early")
            return
        time.sleep(POLL_S)


def launch_local(
    spec: RunSpec,
    timeout: float = 600.0,
    memory_cap: int | None = None,
    entry: Sequence[str] | None = None,
    progress: Progress | None = None,
    keep_dir: Path | None = None,
    cancel: threading.Event | None = None,
    on_step: StepHook | None = None,
    rss_cap: int | None = None,
) -> Measurement:
    """Run ``spec`` on this machine with one process per rank and return the job's measurement. Each rank runs in
    the workload's launch environment (:mod:`tuner.measure.driver.launch_env`: its launcher's threads, core binding and
    variables, this process's environment standing for the user's shell); the measurement says which (``launch``).

    Args:
        spec: what to run; its workload's cluster gives the world size.
        timeout: seconds for the whole run, process start included; then every rank is killed.
        memory_cap: optional address-space limit per rank (bytes), to emulate a smaller memory.
        entry: the rank command (default ``python -m tuner.measure.rank.runner``).
        progress: called with (timed steps done on rank 0, timed steps) while waiting.
        keep_dir: write the run's files there instead of a temporary folder.
        cancel: once set, every rank is killed and the run ends ``error`` / ``Cancelled``.
        on_step: sees rank 0's timed step times as they finish; True stops the run, which ends ``ok`` with its
            partial figures and ``stopped_early``.
        rss_cap: resident bytes a rank may hold before it is stopped as ``oom`` (default: :func:`.rank_share`).
    """
    workload = workload_from_dict(spec.workload)
    cluster, launch, threads = workload.cluster, workload.launch, spec.trial.threads_per_rank
    with ExitStack() as held:
        try:
            visible = held.enter_context(_run_devices(spec, cluster.gpus_per_node, cluster.nodes, cancel))
        except TooFewDevices as error:
            return Measurement(status="error", exception_type=error.kind, error=str(error))
        run_dir = keep_dir or Path(held.enter_context(tempfile.TemporaryDirectory(prefix="dstune-run-")))
        run_dir.mkdir(parents=True, exist_ok=True)
        spec.write(run_dir)
        port = free_port()
        started = time.monotonic()
        places = local_places(cluster.gpus_per_node, cluster.nodes, visible)
        forked, preload = spec.lean, rank_preloads(spec)
        planned = [plan_rank(launch, place, cluster.nodes, os.environ, threads=threads) for place in places]
        oom_kills = cgroup_oom_kills()  # a rank SIGKILLed meanwhile by the kernel's OOM killer is an ``oom``
        ranks = [
            start_rank(run_dir, place, "127.0.0.1", port, entry, memory_cap, rank_variables(plan), forked, preload)
            for place, plan in zip(places, planned, strict=True)
        ]
        try:
            wait_ranks(ranks, run_dir, timeout, spec.steps, progress, cancel=cancel, on_step=on_step, rss_cap=rss_cap)
        finally:
            stop_ranks(ranks)
            remove_allreduce_buffers(port)
        kills = kills_between(oom_kills, cgroup_oom_kills())
        results = [
            with_plan(collect_rank(run_dir, rank, kills), plan) for rank, plan in zip(ranks, planned, strict=True)
        ]
    measurement = summarize(results, spec)
    measurement.launch = measured_launch(launch, results)
    measurement.set_wall(time.monotonic() - started)
    return measurement


@contextmanager
def _run_devices(spec: RunSpec, gpus: int, nodes: int, cancel: threading.Event | None) -> Iterator[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` of a CUDA run's ranks while it runs: ``gpus`` of this node's GPUs no other run
    holds (:mod:`tuner.measure.driver.gpu_lease`); None on CPU (the variable left as this process has it)."""
    if spec.device != "cuda":
        yield None
        return
    if nodes > 1:
        why = f"the local launcher runs one node; --nodes {nodes} on CUDA needs the Ray launcher"
        raise TooFewDevices(why, kind="InvalidLayout")
    with node_leases().lease(gpus, cancel) as devices:
        yield ",".join(devices)
