"""``measure`` and ``tune`` on this machine: on its GPU, the GPU type and memory read from the device
(:func:`tuner.measure.driver.local_gpu.local_gpu`) where the flags leave them out; on CPU ranks, ``--gpu-memory``
left out is each rank's share of this host's memory (:func:`with_host_share`), not a GPU's 80 GiB."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import cast

from tuner.cli.common import default_device, gpu_device_files, require_local_cuda, require_ray_nodes
from tuner.cli.options import WorkloadFlags
from tuner.workload import GpuTypeName


def with_local_gpu(flags: WorkloadFlags, launcher: str, ray_address: str | None) -> WorkloadFlags:
    """``flags`` with ``--gpu-type`` (and, with it, ``--gpu-memory``: the bytes the device exposes) read from this
    machine's GPU when the ranks train on it and the flags do not say; a given ``--gpu-type`` keeps its own memory.
    Ranks on a Ray cluster are not read here (their GPUs may differ from this machine's)."""
    if flags.device == "cpu" or flags.gpu_type is not None or not gpu_device_files():
        return flags
    if launcher == "ray" and (ray_address or os.environ.get("RAY_ADDRESS")):
        return flags
    from tuner.measure.driver.local_gpu import local_gpu

    gpu = local_gpu()
    if gpu is None:
        return flags
    memory = flags.gpu_memory if flags.gpu_memory is not None else str(gpu.total_memory)
    return replace(flags, gpu_type=cast("GpuTypeName | None", gpu.gpu_type), gpu_memory=memory)


def with_host_share(flags: WorkloadFlags, launcher: str, ray_address: str | None) -> WorkloadFlags:
    """``flags`` with ``--gpu-memory``, where left out on CPU ranks this machine runs, set to each rank's share of
    the host's memory (its total, or its control group's limit, over the ranks): a CPU rank's "device" is the host,
    and 80 GiB a rank would have the estimator (and a length search) plan runs no such host holds. The host's total,
    not what is free now, so a study resumed later keeps its workload; what is free is checked before each run
    (:mod:`tuner.measure.driver.host_memory`). Ranks on a Ray cluster are not read here."""
    if flags.gpu_memory is not None or (flags.device or default_device()) != "cpu":
        return flags
    if launcher == "ray" and (ray_address or os.environ.get("RAY_ADDRESS")):
        return flags
    from tuner.measure.driver.host_memory import host_total

    return replace(flags, gpu_memory=str(host_total() // max(1, flags.gpus * flags.nodes)))


def checked_here(flags: WorkloadFlags, launcher: str, ray_address: str | None) -> WorkloadFlags:
    """The flags of a run from this machine: refused (exit 2) where the ranks cannot run (``--device cuda`` without
    a GPU, several nodes on the local Ray), then with this machine's GPU read (:func:`with_local_gpu`) or, on CPU
    ranks, each rank's share of its memory (:func:`with_host_share`)."""
    require_local_cuda(flags.device, launcher, ray_address)
    require_ray_nodes(flags.nodes, launcher, ray_address)
    return with_host_share(with_local_gpu(flags, launcher, ray_address), launcher, ray_address)
