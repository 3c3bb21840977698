"""GPU types a cluster can be made of (:data:`GPU_TYPES`), each declared once: the memory the card really exposes
to PyTorch, its compute capability and SM count (what the CUDA context and cuBLAS workspace depend on), and its
datasheet rates (what the throughput model starts from). :func:`gpu_type_of` maps a device's name and memory, as
``torch.cuda.get_device_name()`` and ``get_device_properties().total_memory`` give them, to a type: the measure
room reads them from the device, this module stays pure.

``usable_memory``: what ``torch.cuda.get_device_properties(i).total_memory`` (CUDA's ``totalGlobalMem``, the
"total capacity" of PyTorch's out-of-memory message) reports, not the marketing size and not ``nvidia-smi``'s total
(an H100 80GB: 81,559 MiB in ``nvidia-smi`` [modal-labs/modal-client PR #2797], 81,082-81,090 MiB to PyTorch).
Where sources differ by driver, the smallest figure quoted is taken. Sources, as printed:

* A100 40GB: ``_gpuDeviceProperties(name='A100-SXM4-40GB', ..., total_memory=40536MB)`` [PaddlePaddle
  ``paddle.device.cuda.get_device_properties`` docstring]; "39.39 GiB total capacity" [imoneoi/openchat#34]: 39.39 GiB.
* A100 80GB: "GPU 2 has a total capacity of 79.25 GiB" on 4 A100 80GB [wbfwonderful/Vad-R1#11]: 79.25 GiB.
* H100 80GB HBM3: ``total_memory=81082MB`` (torch 2.0.1), ``81089MB`` (torch 2.7), ``81090MB``.
* H200: ``total_memory=143156MB``. L40S: ``total_memory=45589MB``. RTX 3090: ``total_memory=24268MB`` (Hugging Face
  docs), ``24259MB``. RTX 4090: ``total_memory=24563MB``. V100 16GB: ``total_memory=16160MB``, ``16130MB``;
  V100 32GB: ``total_memory=32510MB`` (31.75 GiB total capacity [deepspeedai/DeepSpeed#3312]).
  (PyTorch prints ``total_memory`` in MiB with an ``MB`` suffix.)

Rates (dense, no sparsity; NVIDIA datasheets and architecture whitepapers): 16-bit tensor-core TFLOP/s with fp32
accumulation (bf16; the V100 has no bf16: its fp16), plain fp32 TFLOP/s, memory bandwidth, the GPU-to-GPU link of
one direction inside a node (NVLink, else PCIe), the network per GPU between nodes and host PCIe of one direction:

* V100 SXM2: 125 fp16, 15.7 fp32, HBM2 900 GB/s, NVLink 2 300 GB/s total, PCIe Gen3 x16 16 GB/s.
* A100 SXM4: 312 bf16, 19.5 fp32, HBM2 1,555 GB/s (40GB) / HBM2e 2,039 GB/s (80GB), NVLink 3 600 GB/s total,
  PCIe Gen4 32 GB/s; 200 Gb/s HDR per GPU (DGX A100).
* H100 SXM5 / H200 SXM: 989 bf16, 67 fp32, HBM3 3.35 TB/s / HBM3e 4.8 TB/s, NVLink 4 900 GB/s total, PCIe Gen5
  64 GB/s; 400 Gb/s NDR per GPU (DGX H100/H200).
* L40S: 362 bf16, 91.6 fp32, GDDR6 864 GB/s, no NVLink (PCIe Gen4 32 GB/s between GPUs).
* RTX 3090: 71 bf16 (fp32 accumulate), 35.6 fp32, GDDR6X 936 GB/s, PCIe Gen4 (NVLink bridge not assumed).
* RTX 4090: 165.2 bf16 (fp32 accumulate), 82.6 fp32, GDDR6X 1,008 GB/s, PCIe Gen4, no NVLink.

Consumer and PCIe cards: 100 Gb/s (12.5 GB/s) between nodes is assumed (no reference architecture).

Example:
    >>> gpu_type_of("NVIDIA A100-SXM4-80GB", 79 * 2**30), gpu_type_of("Tesla V100-SXM2-16GB"), gpu_type_of("T4")
    ('a100-80gb', 'v100-16gb', None)
    >>> GPU_TYPES["h100-80gb"].usable_memory // 2**20, GPU_TYPES["v100-32gb"].bf16
    (81082, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

MiB = 2**20
GB = 10**9

GpuTypeName = Literal[
    "a100-40gb", "a100-80gb", "h100-80gb", "h200", "l40s", "rtx-3090", "rtx-4090", "v100-16gb", "v100-32gb"
]
GPU_TYPE_NAMES: tuple[str, ...] = get_args(GpuTypeName)


@dataclass(frozen=True)
class GpuType:
    """One GPU type: memory PyTorch sees, architecture, and datasheet rates (module docstring for sources)."""

    name: str
    usable_memory: int  # bytes: get_device_properties().total_memory
    compute_capability: int  # major·10 + minor: 70 Volta, 80 A100, 86 GA10x, 89 Ada, 90 Hopper
    sms: int
    threads_per_sm: int  # resident threads per SM (2048; 1536 on sm86/sm89)
    peak_tflops: float  # dense 16-bit tensor TFLOP/s, fp32 accumulation (bf16; fp16 where there is no bf16)
    fp32_tflops: float
    memory_bw: float  # bytes/s
    intra_bw: float  # bytes/s, one direction, between GPUs of a node
    inter_bw: float  # bytes/s, one direction, per GPU between nodes
    host_bw: float  # bytes/s, one direction, PCIe to the host
    bf16: bool = True
    nvlink: bool = True

    @property
    def hopper(self) -> bool:
        """sm90 or later: 32 MiB cuBLAS workspaces, NVLink SHARP buffers."""
        return self.compute_capability >= 90


def _type(name: str, memory: int, cc: int, sms: int, rates: tuple[float, ...], **flags: bool) -> GpuType:
    peak, fp32, memory_bw, intra, inter, host = rates
    return GpuType(
        name, memory, cc, sms, 1536 if cc in (86, 89) else 2048, peak, fp32,
        memory_bw * GB, intra * GB, inter * GB, host * GB, **flags,
    )  # fmt: skip


GPU_TYPES: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        _type("a100-40gb", int(39.39 * 2**30), 80, 108, (312, 19.5, 1555, 300, 25, 32)),
        _type("a100-80gb", int(79.25 * 2**30), 80, 108, (312, 19.5, 2039, 300, 25, 32)),
        _type("h100-80gb", 81_082 * MiB, 90, 132, (989, 67, 3350, 450, 50, 64)),
        _type("h200", 143_156 * MiB, 90, 132, (989, 67, 4800, 450, 50, 64)),
        _type("l40s", 45_589 * MiB, 89, 142, (362, 91.6, 864, 32, 12.5, 32), nvlink=False),
        _type("rtx-3090", 24_259 * MiB, 86, 82, (71, 35.6, 936, 32, 12.5, 32), nvlink=False),
        _type("rtx-4090", 24_563 * MiB, 89, 128, (165.2, 82.6, 1008, 32, 12.5, 32), nvlink=False),
        _type("v100-16gb", 16_130 * MiB, 70, 80, (125, 15.7, 900, 150, 12.5, 16), bf16=False),
        _type("v100-32gb", 32_510 * MiB, 70, 80, (125, 15.7, 900, 150, 12.5, 16), bf16=False),
    )
}
assert tuple(GPU_TYPES) == GPU_TYPE_NAMES

# (marker in the device name, type for a small card, type for a large one, the memory between them)
_NAMES = (
    ("H200", "h200", "h200", 0),
    ("H100", "h100-80gb", "h100-80gb", 0),
    ("H800", "h100-80gb", "h100-80gb", 0),
    ("A100", "a100-40gb", "a100-80gb", 60 * 2**30),
    ("A800", "a100-40gb", "a100-80gb", 60 * 2**30),
    ("L40S", "l40s", "l40s", 0),
    ("RTX 3090", "rtx-3090", "rtx-3090", 0),
    ("RTX 4090", "rtx-4090", "rtx-4090", 0),
    ("V100", "v100-16gb", "v100-32gb", 24 * 2**30),
)


def gpu_type_of(device_name: str | None, total_memory: int | None = None) -> str | None:
    """The type of a device from its name (``torch.cuda.get_device_name()``) and, for cards sold with two memory
    sizes, its ``total_memory`` (or the size in its name: ``A100-SXM4-80GB``); None when unknown."""
    if not device_name:
        return None
    for marker, small, large, between in _NAMES:
        if marker not in device_name:
            continue
        if not between:
            return small
        if total_memory:
            return large if total_memory > between else small
        sized = [gb for gb in (80, 40, 32, 16) if f"{gb}GB" in device_name.replace(" ", "")]
        return large if sized and sized[0] * 2**30 > between else small
    return None


def default_gpu_memory(gpu_type: str | None) -> int:
    """Memory per GPU when none is given: the type's usable memory, else 80 GiB."""
    return GPU_TYPES[gpu_type].usable_memory if gpu_type else 80 * 2**30


def bf16_problem(gpu_type: str, precision: str) -> str | None:
    """Why ``precision`` cannot train on ``gpu_type`` (bf16 before Ampere), or None."""
    gpu = GPU_TYPES.get(gpu_type)
    if gpu is not None and precision == "bf16" and not gpu.bf16:
        return f"bf16 needs an Ampere or newer GPU: {gpu_type} has no bf16 (use fp16 or fp32)"
    return None


__all__ = [
    "GPU_TYPES",
    "GPU_TYPE_NAMES",
    "GpuType",
    "GpuTypeName",
    "bf16_problem",
    "default_gpu_memory",
    "gpu_type_of",
]
