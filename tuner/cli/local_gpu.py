"""``measure`` and ``tune`` on this machine's GPU: the GPU type and memory read from the device
(:func:`tuner.measure.driver.local_gpu.local_gpu`) where the flags leave them out."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import cast

from tuner.cli.common import gpu_device_files, require_local_cuda, require_ray_nodes
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


def checked_here(flags: WorkloadFlags, launcher: str, ray_address: str | None) -> WorkloadFlags:
    """The flags of a run from this machine: refused (exit 2) where the ranks cannot run (``--device cuda`` without
    a GPU, several nodes on the local Ray), then with this machine's GPU read (:func:`with_local_gpu`)."""
    require_local_cuda(flags.device, launcher, ray_address)
    require_ray_nodes(flags.nodes, launcher, ray_address)
    return with_local_gpu(flags, launcher, ray_address)
