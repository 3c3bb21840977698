"""Run a measured run's ranks on Ray as a multi-node job: ``--gpus G --nodes M`` is G ranks on each of M nodes.

Placement: one placement-group bundle per node (G ranks' CPUs, plus G GPUs on CUDA; a rank reserves the threads its
launch environment gives it, at most its share of a node: :func:`tuner.measure.driver.launch_env.reserved_cpus`),
``STRICT_SPREAD`` so that the M bundles land on M distinct nodes, and G rank actors in each bundle. Node rank = bundle
index; within a node, local ranks follow the GPU ids Ray assigned (as Ray Train orders them); rank = node rank × G +
local rank. Every rank gets torchrun's environment (:class:`tuner.measure.driver.places.RankPlace`): ``MASTER_ADDR`` is
rank 0's node address, ``LOCAL_RANK`` 0..G-1 within its node, and on CUDA every rank of a node sees all the GPUs the
job holds there (``CUDA_VISIBLE_DEVICES`` shared, as Ray Train does), so NCCL can use NVLink/P2P and the rank picks
its device by ``LOCAL_RANK``. Its launch environment is planned on its node, with the driver's environment as the
user's (Ray's own ``OMP_NUM_THREADS`` for the actor never reaches the rank). A cluster that cannot hold the layout
answers ``error`` / ``ResourcesUnavailable`` at the placement timeout, naming what its nodes lack (or, when they could
hold it, what is free while other jobs hold the rest). It waits even when no alive node could ever hold the layout: an
autoscaling cluster (KubeRay) adds nodes on demand.

Why not Ray Train's worker group (``ray.train.torch.TorchTrainer``, read for its conventions and reused in spirit):

* it groups local ranks by node *IP* (``WorkerGroup._assign_worker_ranks``), so two Ray nodes behind one address,
  such as a ``ray.cluster_utils.Cluster`` on one machine or containers on host networking, would become one node
  with local ranks 0..2G-1; here nodes are Ray node ids;
* ``ScalingConfig`` reserves one bundle per worker with ``PACK`` or ``SPREAD``, which cannot promise exactly G ranks
  on each of M nodes;
* it runs the training function inside the actor process, while a measured run needs each rank in a fresh process
  that the launcher kills with its process group at the deadline or when a peer fails
  (``tuner.measure.driver.local_launcher``), and its controller adds seconds to every short run.

Each actor starts its rank with the local launcher's machinery, so Ray adds placement, not new failure modes.
Retries are off everywhere: Ray's defaults would silently re-run a crashed rank.
"""

from __future__ import annotations

import os
import socket
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

from tuner.measure.driver.host_memory import rank_share
from tuner.measure.driver.launch_env import (
    measured_launch,
    node_inherited,
    plan_rank,
    rank_variables,
    reserved_cpus,
    with_plan,
)
from tuner.measure.driver.local_launcher import Progress, wait_ranks
from tuner.measure.driver.outcomes import MTIME_SLACK_S, collect_rank, placed, summarize
from tuner.measure.driver.places import RankPlace, free_port
from tuner.measure.driver.processes import rank_preloads, start_rank, stop_ranks
from tuner.measure.driver.ray_address import check_reachable
from tuner.measure.driver.ray_placement import assign_places, node_bundle, node_shape, why_unplaced
from tuner.measure.driver.ray_reaper import start_reaper
from tuner.measure.driver.shm_buffers import remove_allreduce_buffers
from tuner.measure.measurement import EXCERPT_CHARS, INFRA_LOST, Measurement, RankResult, StepHook
from tuner.measure.oom import cgroup_oom_kills, kills_between
from tuner.measure.run_protocol import RunSpec, read_progress, result_path
from tuner.workload import workload_from_dict

PLACEMENT_TIMEOUT_S = 60.0
# what Ray raises for a rank whose node or host actor died: not the config's failure
LOST = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError)
UNAVAILABLE = "ResourcesUnavailable"


def ensure_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Connect to the Ray cluster at ``address`` (default ``$RAY_ADDRESS``, which Ray sets inside a Ray job), or start
    a private local Ray once per process (with :func:`start_reaper`: it dies with this process): never the cluster
    Ray last recorded in ``/tmp/ray/ray_current_cluster``, which ``ray.init()`` would join (or fail on, given
    ``num_cpus``) even when it is stale or another process's."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)  # Ray retries a GCS that does not answer: a mistyped address waited minutes
        ray.init(address=address, log_to_driver=False)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local Ray needs no token file
    ray.init(
        address="local",
        num_cpus=num_cpus or os.cpu_count(),
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
    start_reaper()  # its agents die with this process, even a SIGKILLed one


@ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)  # type: ignore[call-overload]  # actor options
class RankHost:
    """Hosts one rank's process on whichever node Ray placed it."""

    def __init__(self) -> None:
        self.stop = False
        self.cancelled = threading.Event()
        self.early = threading.Event()
        self.early_at: float | None = None
        self.run_dir: Path | None = None
        self.rank = 0

    def describe(self) -> dict[str, Any]:
        """Where this actor runs: Ray's node id, the node's address, the host name and the GPU ids Ray gave it."""
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpu_ids": [str(gpu) for gpu in context.get_accelerator_ids().get("GPU", [])],
        }

    def free_port(self) -> int:
        """A free port on this node, for rank 0's rendezvous."""
        return free_port()

    def abort(self) -> None:
        """Ask a running :meth:`run` to kill its rank (a peer failed)."""
        self.stop = True

    def cancel(self) -> None:
        """Ask a running :meth:`run` to kill its rank at once (the study was stopped)."""
        self.cancelled.set()

    def stop_early(self, decided_at: float) -> None:
        """Ask a running :meth:`run` to stop its rank now and report its partial step times. ``decided_at`` (wall
        clock) is when the driver decided: a peer's rank stopped first can break this rank's collective before this
        call arrives, and what the rank reports after that moment follows from the stop, not from its config."""
        self.early_at = decided_at
        self.early.set()

    def progress(self) -> list[float]:
        """The timed step times the rank finished so far."""
        return read_progress(self.run_dir, self.rank) if self.run_dir is not None else []

    def run(
        self,
        spec: dict[str, Any],
        place: RankPlace,
        master: tuple[str, int],
        timeout: float,
        memory_cap: int | None,
        entry: Sequence[str] | None,
        inherited: dict[str, str],
    ) -> dict[str, Any]:
        """Run one rank to the end (or the deadline) and return its result; its launch environment is planned here,
        on its node (this node's cores), with ``inherited`` (the driver's environment) as the user's."""
        with tempfile.TemporaryDirectory(prefix=f"dstune-rank{place.rank}-") as scratch:
            run_dir = Path(scratch)
            self.run_dir, self.rank = run_dir, place.rank
            run_spec = RunSpec(**spec)
            run_spec.write(run_dir)
            forked, preload = run_spec.lean, rank_preloads(run_spec)
            workload = workload_from_dict(run_spec.workload)
            threads = run_spec.trial.threads_per_rank
            inherited = node_inherited(inherited, os.environ)  # the node's own NCCL_* and allocator settings win
            plan = plan_rank(workload.launch, place, workload.cluster.nodes, inherited, threads=threads)
            variables = rank_variables(plan)
            oom_kills = cgroup_oom_kills()
            rss_cap = rank_share(workload.cluster.gpus_per_node)  # this node's ranks (one Ray node per bundle)
            process = start_rank(run_dir, place, master[0], master[1], entry, memory_cap, variables, forked, preload)
            try:
                wait_ranks(
                    [process],
                    run_dir,
                    timeout,
                    run_spec.steps,
                    should_stop=lambda: self.stop,
                    cancel=self.cancelled,
                    on_step=lambda times: self.early.is_set(),
                    rss_cap=rss_cap,
                )
            finally:
                stop_ranks([process])
                remove_allreduce_buffers(master[1], [place.rank])  # this node's segment of the rank
            failed = process.killed_for is None and process.process.returncode
            if self.early_at is not None and process.killed_for is None:  # ended by the stop, before it was asked
                process.killed_for, process.signalled_at = "stopped_early", self.early_at
            kills = kills_between(oom_kills, cgroup_oom_kills())
            result = asdict(with_plan(collect_rank(run_dir, process, kills), plan))
            if_stopped = None
            if failed and process.killed_for is None and read_progress(run_dir, place.rank):
                # failed after timed steps, no stop heard of: a stop the driver decided may have broken its collective
                # while the notice was on its way. The driver knows whether and when it decided: it picks the reading
                process.killed_for, process.signalled_at = "stopped_early", 0.0
                if_stopped = asdict(with_plan(collect_rank(run_dir, process, kills), plan))
            self.run_dir = None
            return {"result": result, "if_stopped": if_stopped, "ended_at": _report_time(run_dir, place.rank)}


def _report_time(run_dir: Path, rank: int) -> float | None:
    """When the rank wrote its result (wall clock, the node's), or None when it wrote none."""
    try:
        return result_path(run_dir, rank).stat().st_mtime
    except FileNotFoundError:
        return None


def _reading(answer: dict[str, Any], decided_at: float | None) -> RankResult:
    """A rank host's result. One that failed after timed steps with no stop heard of comes with its reading as
    stopped early: taken when the driver had decided a stop (at ``decided_at``) before the rank wrote its failure
    (or it wrote none), since the stop then broke its collective (as :func:`collect_rank` reads a stopped rank)."""
    stopped, ended_at = answer["if_stopped"], answer["ended_at"]
    if stopped is not None and decided_at is not None and (ended_at is None or ended_at >= decided_at - MTIME_SLACK_S):
        return RankResult.from_dict(stopped)
    return RankResult.from_dict(answer["result"])


def _unavailable(error: str) -> Measurement:
    return Measurement(status="error", exception_type=UNAVAILABLE, error=error)


def launch_ray(
    spec: RunSpec,
    timeout: float = 600.0,
    address: str | None = None,
    memory_cap: int | None = None,
    entry: Sequence[str] | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    placement_timeout: float = PLACEMENT_TIMEOUT_S,
    on_step: StepHook | None = None,
) -> Measurement:
    """Run ``spec`` as a ``nodes`` × ``gpus_per_node`` job of Ray actors; same result as
    :func:`tuner.measure.driver.local_launcher.launch_local` (``cancel`` and ``on_step`` included)."""
    ensure_ray(address)
    cluster = workload_from_dict(spec.workload).cluster
    cuda = spec.device == "cuda"
    launch, inherited = workload_from_dict(spec.workload).launch, dict(os.environ)
    threads = spec.trial.threads_per_rank
    node_cpus, node_gpus = node_shape(ray.nodes(), cuda)
    cpus = reserved_cpus(launch, cluster.gpus_per_node, node_cpus, inherited, threads, node_gpus if cuda else 0)
    bundle = node_bundle(cluster.gpus_per_node, cuda, cpus)
    started = time.monotonic()
    group = placement_group([bundle] * cluster.nodes, strategy="STRICT_SPREAD")
    try:
        ray.get(group.ready(), timeout=placement_timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        return _unavailable(why_unplaced(bundle, cluster.nodes, placement_timeout))
    hosts = [
        [
            RankHost.options(  # type: ignore[attr-defined]  # ray.remote made it an actor class
                num_cpus=cpus,
                num_gpus=1 if cuda else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=node),
            ).remote()
            for _ in range(cluster.gpus_per_node)
        ]
        for node in range(cluster.nodes)
    ]
    flat = [host for row in hosts for host in row]
    try:
        described = ray.get([host.describe.remote() for host in flat], timeout=placement_timeout)
        per_node = cluster.gpus_per_node
        places = assign_places([described[i : i + per_node] for i in range(0, len(flat), per_node)], cuda)
        by_rank = sorted(zip([p for row in places for p in row], flat, described, strict=True), key=lambda t: t[0].rank)
        master = (by_rank[0][2]["node_ip"], ray.get(by_rank[0][1].free_port.remote(), timeout=placement_timeout))
        refs = {
            host.run.remote(asdict(spec), place, master, timeout, memory_cap, entry, inherited): place
            for place, host, _ in by_rank
        }
        first = by_rank[0][1]
        results = _gather(refs, flat, timeout + 30.0, spec.steps, progress, cancel, (first, on_step))
    finally:
        for host in flat:
            ray.kill(host)
        remove_placement_group(group)
    measurement = summarize(results, spec)  # a lost node, actor or fork server: the run is InfraLost
    measurement.launch = measured_launch(launch, results)
    measurement.set_wall(time.monotonic() - started)
    return measurement


def _gather(
    refs: dict[Any, RankPlace],
    hosts: list[Any],
    timeout: float,
    steps: int,
    progress: Progress | None,
    cancel: threading.Event | None = None,
    watch: tuple[Any, StepHook | None] = (None, None),
) -> list[RankResult]:
    """Collect rank results; after the first failure, tell the other ranks to stop; once ``cancel`` is set, tell
    every rank to die at once. ``watch`` is rank 0's host and the run's step hook: when the hook answers True on the
    host's step times, every rank is told to stop early."""
    deadline = time.monotonic() + timeout
    results: dict[int, RankResult] = {}
    pending = list(refs)
    cancelling = stopping = False
    decided_at: float | None = None
    first, on_step = watch
    while pending:
        if on_step is not None and first is not None and not stopping and not results:
            try:
                times = ray.get(first.progress.remote(), timeout=10.0)
            except ray.exceptions.RayError:
                times = []
            if times and on_step(times):
                stopping, decided_at = True, time.time()
                for host in hosts:
                    host.stop_early.remote(decided_at)
        if cancel is not None and cancel.is_set() and not cancelling:
            cancelling = True
            for host in hosts:
                host.cancel.remote()
        done, pending = ray.wait(pending, timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        for ref in done:
            place = refs[ref]
            try:
                result = _reading(ray.get(ref), decided_at)
            except LOST as error:  # the node (or the actor's process) went away with the rank
                why = "its Ray node or actor was lost mid-run: " + f"{type(error).__name__}: {error}"[-EXCERPT_CHARS:]
                result = RankResult(place.rank, "error", exception_type=INFRA_LOST, error=why)
            except ray.exceptions.RayError as error:
                why = str(error)[-EXCERPT_CHARS:]
                result = RankResult(place.rank, "error", exception_type=type(error).__name__, error=why)
            results[place.rank] = placed(result, place)
            if result.status != "ok":
                for host in hosts:
                    host.abort.remote()
        if progress is not None:
            progress(len(results) * steps // max(1, len(refs)), steps)
        if pending and time.monotonic() >= deadline:
            for ref in pending:
                place = refs[ref]
                late = RankResult(place.rank, "timeout", error="the Ray actor did not answer in time")
                results[place.rank] = placed(late, place)
            break
    return [results[rank] for rank in sorted(results)]
