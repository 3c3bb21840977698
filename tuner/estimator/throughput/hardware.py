"""Hardware constants for the throughput model: a table of known devices (and a CPU host), the starting point that
:mod:`tuner.forecast` corrects from measured runs (as multiplicative factors on the time terms of
:mod:`tuner.estimator.throughput.prediction`, never by editing this table).

Peak dense bf16 FLOP/s come from :data:`tuner.estimator.throughput.flops.PEAK_TFLOPS` (the figures MFU is reported
against), so predicted and measured MFU use one table. The other figures, per device:

* H100 SXM5 / H200 SXM: NVLink 4 at 900 GB/s total, 450 GB/s each way; HBM3 3.35 TB/s (H100), HBM3e 4.8 TB/s (H200);
  PCIe Gen5 x16 at 64 GB/s each way (NVIDIA H100 and H200 datasheets). Inter-node: one 400 Gb/s NDR InfiniBand
  port per GPU, 50 GB/s (DGX H100/H200 reference architecture). FP32 (non-tensor) 67 TFLOP/s.
* A100 SXM4 80GB: 312 TFLOP/s bf16 dense; NVLink 3 at 600 GB/s total, 300 GB/s each way; HBM2e 2.0 TB/s; PCIe Gen4
  x16 at 32 GB/s each way, FP32 19.5 TFLOP/s (NVIDIA A100 datasheet). Inter-node: one 200 Gb/s HDR port per GPU,
  25 GB/s (DGX A100).
* The GPU types a cluster names (``--gpu-type``: :data:`tuner.workload.GPU_TYPES`, keyed by type name: A100
  40/80GB, H100, H200, L40S, RTX 3090/4090, V100 16/32GB) carry their own datasheet rates.
* ``cpu``: DeepSpeed on CPU ranks with gloo. No table can know the host (bf16 matmuls differ 70×
  between an AVX2-only EPYC and an AMX Xeon); the figures are an AVX2-class two-core guess that the fit replaces
  after a few runs: 50 GFLOP/s, 10 GB/s memory copies, loopback "links" at memory speed.

Figures that no datasheet gives are assumptions, labelled so, and are the first the fit corrects:

* ``sustained``: the share of peak FLOP/s dense training reaches; 0.5 is the middle of the 40-55 % MFU published
  for large dense models on A100/H100 with Megatron-LM and DeepSpeed (Narayanan et al. 2021; MLPerf training).
* ``launch_s``: fixed cost per transformer layer per micro-step (kernel launches, Python, hooks).
* ``collective_s``: fixed cost of one collective call or one ZeRO-3 parameter fetch (NCCL small-message latency
  is ~10-30 µs; DeepSpeed's ZeRO-3 hooks add Python per module; gloo on CPU costs ~1 ms).
* ``cpu_adam_params_s``: parameters the host's DeepSpeed CPU-Adam steps per second (AVX-512 server class).

Example:
    >>> from tuner.estimator.throughput.hardware import hardware_for
    >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
    >>> h200 = ClusterSpec(gpus_per_node=8, gpu_memory=143_771 * 2**20)
    >>> hw = hardware_for(Workload(load_builtin_model("gpt2"), h200))
    >>> hw.name, hw.flops / 1e12
    ('H200', 494.5)
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimator.throughput.flops import PEAK_TFLOPS
from tuner.workload import GPU_TYPES, GpuType, Workload, gpu_type_of

GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """Rates of one device kind, per rank. ``flops`` is the sustained dense rate (peak × sustained share)."""

    name: str
    flops: float  # sustained FLOP/s in 16-bit precision (fp32: divided by fp32_slowdown)
    memory_bw: float  # device memory, bytes/s (optimizer step, gradient copies)
    intra_bw: float  # one direction of the link between ranks of a node, bytes/s
    inter_bw: float  # one direction of the network between nodes, per rank, bytes/s
    host_bw: float  # host <-> device (PCIe), one direction, bytes/s
    launch_s: float  # fixed cost per layer per micro-step
    collective_s: float  # fixed cost per collective call or ZeRO-3 fetch
    cpu_adam_params_s: float  # host optimizer rate (DeepSpeed CPU-Adam), parameters/s
    fp32_slowdown: float  # how many times slower fp32 matmuls run than 16-bit ones


def _gpu(name: str, memory_bw: float, intra: float, inter: float, host: float, fp32_tflops: float) -> Hardware:
    return Hardware(
        name=name,
        flops=PEAK_TFLOPS[name] * 1e12 * 0.5,  # sustained: assumption (module docstring)
        memory_bw=memory_bw,
        intra_bw=intra,
        inter_bw=inter,
        host_bw=host,
        launch_s=100e-6,  # assumption: ~10 kernels per layer forward + backward at ~10 µs
        collective_s=50e-6,  # assumption: NCCL latency plus DeepSpeed's per-call Python
        cpu_adam_params_s=1e9,  # assumption: AVX-512 server host
        fp32_slowdown=PEAK_TFLOPS[name] / fp32_tflops,  # PyTorch leaves TF32 matmuls off: plain fp32 CUDA cores
    )


def _typed(gpu: GpuType) -> Hardware:
    """A ``--gpu-type``'s rates (:mod:`tuner.workload.gpu_types`, datasheets), the assumptions as :func:`_gpu`'s."""
    return _gpu(gpu.name, gpu.memory_bw, gpu.intra_bw, gpu.inter_bw, gpu.host_bw, gpu.fp32_tflops)


TABLE: dict[str, Hardware] = {
    "H200": _gpu("H200", memory_bw=4800 * GB, intra=450 * GB, inter=50 * GB, host=64 * GB, fp32_tflops=67),
    "H100": _gpu("H100", memory_bw=3350 * GB, intra=450 * GB, inter=50 * GB, host=64 * GB, fp32_tflops=67),
    "A100": _gpu("A100", memory_bw=2000 * GB, intra=300 * GB, inter=25 * GB, host=32 * GB, fp32_tflops=19.5),
    "cpu": Hardware(
        name="cpu",
        flops=50e9,  # assumption: AVX2-class, two threads (the fit replaces it)
        memory_bw=10 * GB,
        intra_bw=10 * GB,  # gloo over loopback / shared memory: a memory copy
        inter_bw=1.25 * GB,  # 10 GbE between hosts
        host_bw=10 * GB,  # "offload" to the same memory: a copy
        launch_s=2e-3,  # assumption: eager PyTorch on CPU, per layer forward + backward
        collective_s=1e-3,  # assumption: gloo call plus DeepSpeed's hooks
        cpu_adam_params_s=2e8,  # assumption: two cores
        fp32_slowdown=0.5,  # AVX2 hosts multiply fp32 faster than bf16; AMX hosts the reverse
    ),
    **{name: _typed(gpu) for name, gpu in GPU_TYPES.items()},
}


def table_key(workload: Workload, device_name: str | None = None) -> str:
    """The table key for a workload: the GPU named by ``device_name`` (``torch.cuda.get_device_name()``) when known,
    else the cluster's GPU type (``--gpu-type``), else guessed from the GPU memory (over 100 GiB: H200; 80 GiB-class:
    H100; smaller: A100), or ``cpu``."""
    if workload.cluster.device == "cpu":
        return "cpu"
    if device_name:
        for key in TABLE:
            if key != "cpu" and key in device_name:
                return key
        named = gpu_type_of(device_name)
        if named:
            return named
    if workload.cluster.gpu_type:
        return workload.cluster.gpu_type
    memory = workload.cluster.gpu_memory
    return "H200" if memory > 100 * 2**30 else "H100" if memory > 60 * 2**30 else "A100"


def hardware_for(workload: Workload, device_name: str | None = None) -> Hardware:
    """The table's constants for the workload's device (see :func:`table_key`)."""
    return TABLE[table_key(workload, device_name)]


__all__ = ["TABLE", "Hardware", "hardware_for", "table_key"]
