"""The GPU this machine's ranks would run on, read from the device: its name, the memory PyTorch sees, and its type
(:func:`tuner.workload.gpu_type_of`). Imports torch, so only the commands that train call it.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.workload import gpu_type_of


class LocalGpu(NamedTuple):
    """Device 0 as torch sees it (``CUDA_VISIBLE_DEVICES`` applies): ranks of one node get the same kind."""

    name: str
    total_memory: int  # bytes: get_device_properties().total_memory
    gpu_type: str | None  # None: a card dstune has no type for


def local_gpu() -> LocalGpu | None:
    """This machine's first visible GPU, or None without one (torch sees no CUDA device)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    total = int(torch.cuda.get_device_properties(0).total_memory)
    return LocalGpu(name, total, gpu_type_of(name, total))
