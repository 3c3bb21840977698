"""What a CUDA device costs beyond the tensors a step holds, per device kind (pure arithmetic, calibratable).

Terms, per rank (sources in brackets and in ``bench/results/gpu_terms.md``; not yet measured on a GPU):

* ``cuda_context``: the CUDA context, outside PyTorch's caching allocator, as two parts.
  ``local_memory``: CUDA reserves local memory (thread stacks) for every thread that can be resident: SMs × resident
  threads per SM × ``cudaLimitStackSize`` (1 KiB by default) [CUDA C++ Programming Guide, ``cudaDeviceSetLimit``]:
  216 MiB on an A100 (108 SMs × 2048), 264 MiB on H100/H200 SXM (132 SMs), 296 MiB on B200 (148 SMs); a
  ``--gpu-type``'s own SMs and resident threads (:data:`TYPED`: 1,536 per SM on sm86/sm89, so 123 MiB on an RTX
  3090, 192 MiB on an RTX 4090, 213 MiB on an L40S; 160 MiB on a V100).
  ``modules``: the kernels loaded into it. PyTorch loads modules lazily since 1.13 (``CUDA_MODULE_LOADING=LAZY``:
  287 MB for one small tensor against 667 MB eager [pytorch PR #86509]; maintainers quote 300-400 MB [pytorch
  #107667, #109888]); training loads cuBLAS, attention, NCCL and DeepSpeed kernels: one 80 GB training OOM leaves
  0.95 GiB outside PyTorch [vllm-project/compressed-tensors PR #587]. 500 MiB by default (assumption, calibrate:
  ``torch.cuda.mem_get_info`` minus ``memory_reserved`` minus NCCL after the first step).
* ``nccl_<group>``: one term per NCCL communicator DeepSpeed opens (:mod:`.nccl`: which groups, and
  their buffers by size, ranks per node, NVLS, network and all-to-all peers).
* ``cublas_workspace``: cuBLAS's workspace per (handle, stream) that runs GEMMs, taken from the caching allocator
  (so it shows in ``memory_allocated``): 32 MiB on sm90 and later (``:4096:8``), 8,320 KiB elsewhere
  (``:4096:2:16:8``) [aten/src/ATen/cuda/CublasHandlePool.cpp, workspaces keyed by (handle, stream); the sm90 size
  from pytorch PR #120925]. PyTorch hands each thread its own handle, and autograd runs backward on its own device
  thread, so training has two: the forward's and the backward's (recomputation included), both on the default
  stream. DeepSpeed's other streams (ZeRO-1/2 ``overlap_comm`` reduction stream, ZeRO-3 all-gather and
  reduce-scatter streams) copy, scale and communicate but run no GEMM, so they add no workspace. cuBLASLt shares
  the cuBLAS workspace of its handle and stream in current PyTorch (assumption: older releases kept a separate
  ``CUBLASLT_WORKSPACE_SIZE`` one, 1 MiB by default).
* ``allocator_reserve``: reserved beyond allocated in the caching allocator, simulated on a plausible allocation
  sequence of the step (:mod:`.allocator`, :mod:`.alloc_sequence`); a kind may set a
  flat share of the peak instead (``allocator_share``: published reserved/allocated 1.02-2.08 [compressed-tensors
  #587; cosmos-rl PR #388; torchtune #1185], 15 % mean and up to 33 % fragmentation [GMLake, ASPLOS'24]).

A kind's numbers are defaults for calibration: :func:`dataclasses.replace` a field with a measured value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from tuner.estimator.runtime.nccl import NcclCosts, communicator_bytes
from tuner.workload import GPU_TYPES, Ranks, gpu_type_of

MiB = 2**20
STACK_BYTES = 1024  # cudaLimitStackSize's default per thread
GEMM_HANDLES = 2  # the forward thread's cuBLAS handle and autograd's backward thread's, both on the default stream


@dataclass(frozen=True)
class DeviceKind:
    """Per-rank bytes a CUDA device kind adds beyond tensors (see the module docstring for each term's source)."""

    name: str
    sms: int = 108
    threads_per_sm: int = 2048
    modules: int = 500 * MiB
    nccl: NcclCosts = field(default_factory=NcclCosts)
    cublas_workspace: int = 8320 * 1024
    gemm_handles: int = GEMM_HANDLES
    allocator_share: float | None = None  # None: simulate the allocator; a share of the peak otherwise

    @property
    def local_memory(self) -> int:
        """Bytes CUDA reserves for resident threads' stacks (SMs × threads per SM × 1 KiB)."""
        return self.sms * self.threads_per_sm * STACK_BYTES

    @property
    def context(self) -> int:
        """The CUDA context: thread-stack reserve plus loaded modules."""
        return self.local_memory + self.modules

    def overhead(self, peak: int, ranks: Ranks, simulated_reserve: int = 0) -> dict[str, int]:
        """The named overhead terms of one rank whose tensors peak at ``peak`` bytes.

        ``simulated_reserve``: the simulated allocator's reserved-beyond-allocated bytes, used unless the kind
        sets a flat ``allocator_share``.
        """
        return self.with_reserve(outside_allocator(self, ranks), peak, simulated_reserve)

    def with_reserve(self, outside: OutsideAllocator, peak: int, simulated_reserve: int = 0) -> dict[str, int]:
        """:meth:`overhead` from the terms outside the allocator (:func:`outside_allocator`)."""
        terms = dict(outside.terms)
        share = self.allocator_share
        terms["allocator_reserve"] = int(share * peak) if share is not None else simulated_reserve
        return terms


class OutsideAllocator(NamedTuple):
    """The terms of :meth:`DeviceKind.overhead` before the allocator's, which depend on the kind and the groups only,
    and the device memory the caching allocator cannot use of them: the CUDA ``context`` and the ``nccl``
    communicators' buffers together."""

    terms: tuple[tuple[str, int], ...]
    context: int
    nccl: int


@functools.lru_cache(maxsize=256)
def outside_allocator(kind: DeviceKind, ranks: Ranks) -> OutsideAllocator:
    """The terms outside the allocator of ``kind`` with the communicators of ``ranks`` (:class:`OutsideAllocator`)."""
    terms = [("cuda_context", kind.context)]
    for group in ranks.communicators():
        terms.append((f"nccl_{group.name}", communicator_bytes(group, kind.nccl)))
    terms.append(("cublas_workspace", kind.gemm_handles * kind.cublas_workspace))
    nccl = sum(size for name, size in terms if name.startswith("nccl_"))
    return OutsideAllocator(tuple(terms), kind.context, nccl)


_HOPPER_NCCL = NcclCosts(nvls=256 * MiB)
KINDS = {
    "A100": DeviceKind("A100", sms=108),
    "H100": DeviceKind("H100", sms=132, nccl=_HOPPER_NCCL, cublas_workspace=32 * MiB),
    "H200": DeviceKind("H200", sms=132, nccl=_HOPPER_NCCL, cublas_workspace=32 * MiB),
    "B200": DeviceKind("B200", sms=148, nccl=_HOPPER_NCCL, cublas_workspace=32 * MiB),  # sm100: sizes assumed
}
# --gpu-type's kinds: SMs and resident threads from the type, sm90's workspace and NVLS buffers on Hopper
TYPED = {
    name: DeviceKind(name, sms=gpu.sms, threads_per_sm=gpu.threads_per_sm)
    if not gpu.hopper
    else DeviceKind(name, sms=gpu.sms, threads_per_sm=gpu.threads_per_sm, nccl=_HOPPER_NCCL, cublas_workspace=32 * MiB)
    for name, gpu in GPU_TYPES.items()
}
OTHER = DeviceKind("other")
HOPPER = KINDS["H100"]
NAMES = (("GH200", "H200"), ("H200", "H200"), ("H100", "H100"), ("H800", "H100"), ("B200", "B200"), ("A100", "A100"))


def device_kind(device_name: str | None) -> DeviceKind:
    """The kind of a GPU from its name (``torch.cuda.get_device_name()``), or the A100-like default.

    Example:
        >>> device_kind("NVIDIA H200").name, device_kind("NVIDIA A100-SXM4-80GB").name, device_kind(None).name
        ('H200', 'A100', 'other')
    """
    for marker, key in NAMES:
        if device_name and marker in device_name:
            return KINDS[key]
    typed = gpu_type_of(device_name)
    return TYPED[typed] if typed else OTHER
