"""Inside a rank: apply the launch environment its launcher resolved (:class:`tuner.workload.RankEnv`, passed as
``DSTUNE_THREADS_PER_RANK`` and ``DSTUNE_BIND_CORES`` beside the variables themselves) and report what the rank
actually runs with, read back from torch, the environment and the OS.

The cores first (``os.sched_setaffinity``, as ``numactl -C`` would: the OpenMP threads started later inherit the
mask), then torch's threads (``torch.set_num_threads``, which also sets OpenMP's count for this thread, the one
DeepSpeed's CPU Adam steps on; an op built against another OpenMP library reads ``OMP_NUM_THREADS``, which the
launcher set too)."""

from __future__ import annotations

import os
from typing import Any

from tuner.measure.run_protocol import CORES_VARIABLE, THREADS_VARIABLE
from tuner.workload.launch_env import speed_variable


def apply_launch() -> dict[str, Any]:
    """Bind this process to its cores and set torch's threads as the launcher asked; return :func:`launch_report`."""
    import torch

    cores = os.environ.get(CORES_VARIABLE, "")
    if cores:
        os.sched_setaffinity(0, {int(core) for core in cores.split(",")})
    threads = os.environ.get(THREADS_VARIABLE) or os.environ.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    return launch_report()


def launch_report() -> dict[str, Any]:
    """What this rank runs with: torch's threads, the OpenMP threads DeepSpeed's CPU ops get, the cores it may run
    on, and the variables that change speed (threads, ``CUDA_DEVICE_MAX_CONNECTIONS``, allocator, ``NCCL_*``)."""
    import torch

    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "bound": bool(os.environ.get(CORES_VARIABLE)),
        "variables": {name: value for name, value in sorted(os.environ.items()) if speed_variable(name)},
    }
