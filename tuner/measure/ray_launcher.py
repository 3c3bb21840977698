"""Run a measured run's ranks on Ray: one actor per rank, anywhere in a Ray cluster (local Ray by default).

Each actor starts its rank with the same machinery as the local launcher (a fresh process in its own session, killed
with its process group at the deadline), so Ray adds placement, not new failure modes. Retries are off everywhere:
Ray's defaults would silently re-run a crashed rank. The ranks reserve their resources in one placement group
(GPUs = world size on CUDA), and rank 0's node hosts the rendezvous.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tuner.measure.launcher import Progress, collect_rank, free_port, start_rank, stop_ranks, summarize, wait_ranks
from tuner.measure.measurement import Measurement, RankResult
from tuner.measure.runner import RunSpec
from tuner.workload import workload_from_dict

PLACEMENT_TIMEOUT_S = 60.0


def ensure_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Connect to the Ray cluster at ``address`` (default ``$RAY_ADDRESS``, which Ray sets inside a Ray job), or start
    a local Ray once per process."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local Ray needs no token file
    ray.init(num_cpus=num_cpus or os.cpu_count(), num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)


@ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)
class RankHost:
    """Hosts one rank's process on whichever node Ray placed it."""

    def __init__(self) -> None:
        self.stop = False
        self.cancelled = threading.Event()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port, for rank 0."""
        return ray.util.get_node_ip_address(), free_port()

    def abort(self) -> None:
        """Ask a running :meth:`run` to kill its rank (a peer failed)."""
        self.stop = True

    def cancel(self) -> None:
        """Ask a running :meth:`run` to kill its rank at once (the study was stopped)."""
        self.cancelled.set()

    def run(
        self,
        spec: dict[str, Any],
        rank: int,
        world: int,
        master: tuple[str, int],
        timeout: float,
        memory_cap: int | None,
        entry: Sequence[str] | None,
        threads: int,
    ) -> dict[str, Any]:
        """Run one rank to the end (or the deadline) and return its result."""
        with tempfile.TemporaryDirectory(prefix=f"dstune-rank{rank}-") as scratch:
            run_dir = Path(scratch)
            run_spec = RunSpec(**spec)
            run_spec.write(run_dir)
            process = start_rank(run_dir, rank, world, master[0], master[1], 0, entry, memory_cap, threads)
            try:
                wait_ranks(
                    [process], run_dir, timeout, run_spec.steps, should_stop=lambda: self.stop, cancel=self.cancelled
                )
            finally:
                stop_ranks([process])
            return asdict(collect_rank(run_dir, process))


def launch_ray(
    spec: RunSpec,
    timeout: float = 600.0,
    address: str | None = None,
    memory_cap: int | None = None,
    entry: Sequence[str] | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Measurement:
    """Run ``spec`` with one Ray actor per rank; same result as :func:`tuner.measure.launcher.launch_local` (``cancel``
    included: once set, every rank is killed)."""
    ensure_ray(address)
    workload = workload_from_dict(spec.workload)
    world = workload.cluster.world_size
    cuda = spec.device == "cuda"
    bundle = {"CPU": 1, "GPU": 1} if cuda else {"CPU": 1}
    started = time.monotonic()
    group = placement_group([bundle] * world, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        return Measurement(
            status="error",
            exception_type="ResourcesUnavailable",
            error=f"Ray could not place {world} ranks with {bundle} each within {PLACEMENT_TIMEOUT_S:.0f} s",
        )
    hosts = [
        RankHost.options(
            num_cpus=1,
            num_gpus=1 if cuda else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
        ).remote()
        for rank in range(world)
    ]
    try:
        master = ray.get(hosts[0].rendezvous.remote(), timeout=PLACEMENT_TIMEOUT_S)
        refs = {
            host.run.remote(asdict(spec), rank, world, master, timeout, memory_cap, entry, 1): rank
            for rank, host in enumerate(hosts)
        }
        results = _gather(refs, hosts, timeout + 30.0, spec.steps, progress, cancel)
    finally:
        for host in hosts:
            ray.kill(host)
        remove_placement_group(group)
    measurement = summarize(results, spec)
    measurement.timings["wall_s"] = time.monotonic() - started
    return measurement


def _gather(
    refs: dict[Any, int],
    hosts: list[Any],
    timeout: float,
    steps: int,
    progress: Progress | None,
    cancel: threading.Event | None = None,
) -> list[RankResult]:
    """Collect rank results; after the first failure, tell the other ranks to stop; once ``cancel`` is set, tell
    every rank to die at once."""
    deadline = time.monotonic() + timeout
    results: dict[int, RankResult] = {}
    pending = list(refs)
    cancelling = False
    while pending:
        if cancel is not None and cancel.is_set() and not cancelling:
            cancelling = True
            for host in hosts:
                host.cancel.remote()
        done, pending = ray.wait(pending, timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        for ref in done:
            rank = refs[ref]
            try:
                results[rank] = RankResult.from_dict(ray.get(ref))
            except ray.exceptions.RayError as error:
                results[rank] = RankResult(rank, "error", exception_type=type(error).__name__, error=str(error)[-1500:])
            if results[rank].status != "ok":
                for host in hosts:
                    host.abort.remote()
        if progress is not None:
            progress(len(results) * steps // max(1, len(refs)), steps)
        if pending and time.monotonic() >= deadline:
            for ref in pending:
                results[refs[ref]] = RankResult(refs[ref], "timeout", error="the Ray actor did not answer in time")
            break
    return [results[rank] for rank in sorted(results)]
