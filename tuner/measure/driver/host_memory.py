"""A measured run's host memory, estimated against the host it runs on and refused before it starts when it would
not fit (:func:`host_refusal`), and a cap on the CPU ranks one host runs (:func:`check_cpu_ranks`).

On CPU ranks the "device" is the host: each rank's estimated peak (``gpu_total``, what ``--gpu-memory`` bounds) lives
in the host's memory beside what the estimator puts in the node's CPU memory (offloaded states, pinned buffers, the
processes themselves: ``cpu_per_node``). On GPUs the host holds the latter only: what offload puts there. A run whose
sum exceeds what the host has available now (:data:`HOST_FRACTION` of it) is not started: it would be killed by the
kernel or Ray's memory monitor, and other users' processes with it. Such a run ends ``oom`` (``HostMemory``): it does
not fit here, and a length search goes down from it as from a measured overflow. What is available is the tighter of
the kernel's figure and this process's memory cgroup (:mod:`~tuner.measure.driver.cgroup_memory`); a run that starts
has each rank capped at its share of it (:func:`rank_share`, :mod:`~tuner.measure.driver.rss_watch`).
"""

from __future__ import annotations

import os
from dataclasses import replace

from tuner.errors import InputError
from tuner.estimator import MemoryEstimate, estimate
from tuner.measure.driver.cgroup_memory import cgroup_limit
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.units import format_bytes
from tuner.workload import TrialConfig, Workload

HOST_MEMORY = "HostMemory"
HOST_FRACTION = 0.8  # of the available memory a run may take: the host's other processes grow too
CPU_RANKS_PER_CPU = 4  # CPU ranks one host may run, per logical CPU (each rank is a whole interpreter and torch)


def available_memory() -> int:
    """The memory a run may take on this host now: :data:`HOST_FRACTION` of what the kernel says is available
    (bytes, MemAvailable), or of what this process's control group may still take when that is less
    (:func:`~tuner.measure.driver.cgroup_memory.cgroup_limit`)."""
    import psutil

    available = psutil.virtual_memory().available
    limited = cgroup_limit()
    if limited is not None:
        available = min(available, limited.headroom)
    return int(available * HOST_FRACTION)


def host_total() -> int:
    """This host's memory as a run here sees it: the kernel's total, or this process's control group's limit when
    that is less (bytes)."""
    import psutil

    limited = cgroup_limit()
    total = psutil.virtual_memory().total
    return min(total, limited.limit) if limited is not None else total


def rank_share(ranks: int) -> int:
    """What one of ``ranks`` ranks started on this host now may hold resident before it is stopped as ``oom``
    (:mod:`tuner.measure.driver.rss_watch`): its share of :func:`available_memory`."""
    return available_memory() // max(1, ranks)


def host_bytes(workload: Workload, estimate: MemoryEstimate) -> int:
    """What the run's ranks on this host need: every node's CPU memory (the local launcher, and Ray on this machine
    alone, run every node here) and, on CPU ranks, every rank's device peak."""
    cluster = workload.cluster
    need = cluster.nodes * int(estimate.cpu_per_node.get("total", 0))
    if cluster.device == "cpu":
        need += cluster.world_size * estimate.gpu_total
    return need


def host_refusal(workload: Workload, estimate: MemoryEstimate, available: int | None = None) -> Measurement | None:
    """The ``oom`` measurement of a run that would not fit this host's ``available`` memory (default: now), or None."""
    need = host_bytes(workload, estimate)
    available = available_memory() if available is None else available
    if need <= available:
        return None
    cluster = workload.cluster
    ranks = f"{cluster.world_size} CPU ranks × {format_bytes(estimate.gpu_total)} + " if cluster.device == "cpu" else ""
    parts = f"{ranks}{format_bytes(int(estimate.cpu_per_node.get('total', 0)))} of CPU memory per node"
    return Measurement(
        status="oom",
        exception_type=HOST_MEMORY,
        error=f"not started: the run needs about {format_bytes(need)} of this host's memory ({parts}), and "
        f"{format_bytes(available)} is available",
    )


def run_refusal(workload: Workload, trial: TrialConfig, options: MeasureOptions) -> Measurement | None:
    """For ranks that run on this host (the local launcher, Ray without an address): refuse more CPU ranks than
    :func:`check_cpu_ranks` takes, and give the ``oom`` measurement of a run that would not fit the host's memory
    (None when it fits, or cannot be estimated: the run itself then says what is wrong)."""
    if options.launcher != "local" and options.ray_address is not None:
        return None
    check_cpu_ranks(workload)
    try:
        planned = estimate(workload, trial)
    except (InputError, ValueError, KeyError, TypeError, ArithmeticError):
        return None
    return host_refusal(workload, planned)


def host_share(workload: Workload, available: int | None = None) -> Workload | None:
    """On CPU ranks, ``workload`` with each rank's memory no more than its share of ``available`` (default: this
    host's, now) and the node's CPU memory no more than all of it: what a length search starts from
    (``--gpu-memory`` says nothing of the host). None when it is already within it, or the ranks are GPUs."""
    cluster = workload.cluster
    if cluster.device != "cpu":
        return None
    available = available_memory() if available is None else available
    share = available // cluster.world_size
    if share >= cluster.gpu_memory:
        return None
    return replace(workload, cluster=replace(cluster, gpu_memory=share, cpu_memory=min(cluster.cpu_memory, available)))


def check_cpu_ranks(workload: Workload, cpus: int | None = None) -> None:
    """Refuse more CPU ranks on this host than :data:`CPU_RANKS_PER_CPU` per logical CPU (:class:`InputError` naming
    ``gpus``)."""
    cluster = workload.cluster
    cap = CPU_RANKS_PER_CPU * (cpus or os.cpu_count() or 1)
    if cluster.device == "cpu" and cluster.world_size > cap:
        raise InputError(
            "gpus", f"{cluster.world_size} CPU ranks on this host's {cap // CPU_RANKS_PER_CPU} CPUs: at most {cap}"
        )


__all__ = [
    "CPU_RANKS_PER_CPU",
    "HOST_MEMORY",
    "available_memory",
    "check_cpu_ranks",
    "host_bytes",
    "host_refusal",
    "host_share",
    "host_total",
    "rank_share",
    "run_refusal",
]
