"""What a CUDA device costs beyond the tensors a step holds, per device kind (pure arithmetic, calibratable).

Terms, per rank (sources in brackets; FIELD_NOTES "What a GPU adds beyond tensors"; not yet measured here):

* ``context``: the CUDA context and the kernels loaded into it, outside PyTorch's caching allocator. PyTorch loads
  modules lazily since 1.13 (``CUDA_MODULE_LOADING=LAZY``: 287 MB for one small tensor against 667 MB eager
  [pytorch PR #86509]); maintainers quote 300-400 MB [pytorch #107667, #109888], and it grows as cuBLAS, attention
  and DeepSpeed kernels load: one 80 GB training OOM leaves 0.95 GiB outside PyTorch [vllm-project/compressed-tensors
  PR #587]. Default 768 MiB, between the two.
* ``nccl_per_communicator``: NCCL's buffers per communicator, outside the allocator: per connection and channel
  Simple 4 MiB (``NCCL_BUFFSIZE``) + LL 512 KiB + LL128 ~4.69 MiB [NVIDIA/nccl src/init.cc, device.h]; measured 544 MB
  for a 2-rank and 688 MB for a larger communicator on 4×A100 NVLink [NVIDIA/nccl #964]. DeepSpeed without an mpu
  opens at least two communicators, the world group and its data-parallel clone [deepspeed/utils/groups.py
  ``_clone_world_group``]; none on one rank. NCCL >= 2.22 allocates at the first collective of each algorithm, so
  the memory is there from step 1.
* ``nvls_per_communicator``: NVLink SHARP buffers on NVSwitch systems (Hopper, on by default): ~1 GiB on NCCL
  2.19-2.20, ~256 MiB from 2.21 [NVIDIA/nccl-tests #216; NCCL release notes]; only with several GPUs on a node.
* ``cublas_workspace``: cuBLAS's workspace per (handle, stream), taken from the caching allocator: 32 MiB on sm90
  (``:4096:8``), 8,320 KiB elsewhere (``:4096:2:16:8``) [aten/src/ATen/cuda/CublasHandlePool.cpp]; one GEMM stream.
* ``allocator_reserve``: reserved beyond allocated in the caching allocator (rounding to 2 MiB, 20 MiB segments for
  1-10 MiB requests, per-stream reuse): reserved/allocated measured 1.02 (steady shapes) to 2.08 [compressed-tensors
  #587; nvidia-cosmos/cosmos-rl PR #388; torchtune #1185]; 7 % of the peak by default.

A kind's numbers are defaults for calibration: :func:`dataclasses.replace` a field with a measured value (for
example ``context`` from ``torch.cuda.mem_get_info`` minus ``memory_reserved`` after the first step).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
COMMUNICATORS = 2  # DeepSpeed's world group and the data-parallel group it clones from it


@dataclass(frozen=True)
class DeviceKind:
    """Per-rank bytes a CUDA device kind adds beyond tensors (see the module docstring for each term's source)."""

    name: str
    context: int = 768 * MiB
    nccl_pair: int = 544 * 10**6  # a 2-rank communicator
    nccl_larger: int = 688 * 10**6  # a communicator of more than 2 ranks
    nvls_per_communicator: int = 0
    cublas_workspace: int = 8320 * 1024
    gemm_streams: int = 1
    allocator_reserve: float = 0.07

    def overhead(self, peak: int, world_size: int, gpus_per_node: int) -> dict[str, int]:
        """The overhead terms for a rank whose tensors peak at ``peak`` bytes, in a job of ``world_size`` ranks."""
        communicators = COMMUNICATORS if world_size > 1 else 0
        per_communicator = self.nccl_pair if world_size == 2 else self.nccl_larger
        nvls = self.nvls_per_communicator if gpus_per_node > 1 else 0
        return {
            "cuda_context": self.context,
            "nccl_buffers": communicators * (per_communicator + nvls),
            "cublas_workspace": self.gemm_streams * self.cublas_workspace,
            "allocator_reserve": int(self.allocator_reserve * peak),
        }


HOPPER = DeviceKind("hopper", nvls_per_communicator=256 * MiB, cublas_workspace=32 * MiB)
OTHER = DeviceKind("other")
HOPPER_NAMES = ("H100", "H200", "H800", "H20", "GH200")


def device_kind(device_name: str | None) -> DeviceKind:
    """The kind of a GPU from its name (``torch.cuda.get_device_name()``): Hopper (sm90) or any other."""
    if device_name and any(name in device_name for name in HOPPER_NAMES):
        return HOPPER
    return OTHER
