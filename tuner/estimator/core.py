"""The analytic memory estimator: workload + ds_config in, bytes per GPU and per node's CPU out.

Model states follow DeepSpeed 0.19 as measured (``tests/test_estimator_deepspeed.py``), not only the ZeRO paper:

* Mixed precision keeps 16-bit parameters and gradients, and an fp32 master with Adam's two moments (12 B/param)
  in the optimizer. fp32 training without ZeRO keeps no separate master (8 B/param of optimizer state); with ZeRO
  1-3 it does (12 B/param), so fp32 ZeRO training holds 20 B/param on one rank, not 16.
* ZeRO-2 reduces gradients into partitions as backward produces them: ``2Ψ/N``, where a rank's gradient buffer
  holds whole the parameters that straddle its partition boundary. ZeRO-1 in DeepSpeed 0.19 holds all ``2Ψ`` 16-bit
  gradients at the end of backward (as the paper says), then reduces them into the same partitions as ZeRO-2, so
  after backward and in the step it measures like ZeRO-2.
* The fp32 copy of the gradients (``4Ψ/N``) exists only during the optimizer step, when the 16-bit gradient partition
  has been released (ZeRO-1/2) or is kept beside it (ZeRO-0 and ZeRO-3, whose flat gradient buffer is permanent).
  With optimizer offload it lives on the CPU for the whole run.
* ZeRO-3 keeps parameters at most ``stage3_param_persistence_threshold`` elements whole on every rank, keeps its
  reduce bucket (``reduce_bucket_size`` elements) allocated from start to end, and gathers parameters on the fly.
  After the forward pass it still holds the gathered parameters it will reuse within ``stage3_max_reuse_distance``,
  up to ``stage3_max_live_parameters`` (with the defaults, 1e9, that is the whole model below 1B parameters).
* ZeRO-1/2 allocate their reduce bucket only during backward, twice with ``overlap_comm`` (double buffering), and
  only with ``contiguous_gradients`` or optimizer offload (with offload, ZeRO-1 keeps one copy; with offload,
  ``overlap_comm``, no ``contiguous_gradients`` and gradient accumulation, both copies stay between micro-steps).
  DeepSpeed's docs quote ``4.5×`` the bucket sizes for ``overlap_comm``; the 0.19 code allocates two reduce buckets.

Peak memory is the maximum over three phases of a step, each a sum of what is alive then: ``forward`` (after the
forward pass: activations plus the logits workspace), ``backward`` (all gradients and the reduce buckets; one
recomputed block when checkpointing) and ``step`` (fp32 gradients). Overhead (CUDA context and allocator
fragmentation) is added on top of the peak; its defaults are calibrated from measured runs later.

Activations come from the workload's model profile when it carries one (traced from the real transformers model,
:mod:`tuner.profile`; plain data here, no torch), else from the built-in models' formulas
(:mod:`tuner.estimator.activations`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.estimator.activations import logits_workspace_bytes, workload_activation_bytes
from tuner.estimator.device import DeviceKind, device_kind
from tuner.estimator.partitions import flat_partition, stage3_partition
from tuner.estimator.settings import Settings, resolve
from tuner.workload import Workload

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
PHASES = ("forward", "backward", "step")
ADAM_STATE_BYTES = 8  # two fp32 moments per parameter
FP32 = 4


@dataclass(frozen=True)
class Overhead:
    """Memory outside the model's tensors, per rank. Defaults until calibration learns better values.

    ``cuda_context``: the CUDA context and kernels' workspace (about 0.5 GiB with PyTorch on Hopper);
    ``fragmentation``: the caching allocator's reserved-but-unallocated share of the peak;
    ``cpu_process``: resident bytes of one rank's process on the host (libraries, Python);
    ``device``: when set, the device kind's itemised terms (context, NCCL buffers per communicator, cuBLAS
    workspace, allocator reserve: :mod:`tuner.estimator.device`) replace ``cuda_context`` and ``fragmentation``.
    """

    cuda_context: int = 512 * 2**20
    fragmentation: float = 0.05
    cpu_process_cuda: int = 3 * 2**30
    cpu_process_cpu: int = 450 * 2**20
    device: DeviceKind | None = None

    @classmethod
    def for_gpu(cls, device_name: str | None) -> Overhead:
        """The overhead of a GPU named like ``torch.cuda.get_device_name()`` (``NVIDIA H200``), by device kind."""
        return cls(device=device_kind(device_name))

    def device_terms(self, peak: int, world_size: int, gpus_per_node: int) -> dict[str, int]:
        """Bytes a CUDA rank adds beyond its tensors' ``peak``, by term."""
        if self.device is not None:
            return self.device.overhead(peak, world_size, gpus_per_node)
        return {"cuda_context": self.cuda_context, "allocator_reserve": int(self.fragmentation * peak)}


DEFAULT_OVERHEAD = Overhead()


@dataclass
class Phase:
    """Bytes alive in one phase of a step on one rank, by category, split into device (GPU) and host (CPU)."""

    gpu: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    cpu: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    @property
    def gpu_total(self) -> int:
        """Device bytes in this phase."""
        return sum(self.gpu.values())

    @property
    def cpu_total(self) -> int:
        """Host bytes of one rank in this phase."""
        return sum(self.cpu.values())

    def by_category(self) -> dict[str, int]:
        """Device + host bytes per category (what a CPU-only run holds in one process)."""
        return {name: self.gpu[name] + self.cpu[name] for name in CATEGORIES}


@dataclass
class MemoryEstimate:
    """The estimate for one workload under one ds_config. All sizes are bytes."""

    n_params: int
    world_size: int
    phases: dict[str, Phase]
    peak_phase: str
    per_gpu: dict[str, int | None]
    cpu_per_node: dict[str, int]
    nvme_per_node: int
    gpu_memory: int
    cpu_memory: int
    details: dict[str, int]
    activations_known: bool
    architecture: str = ""
    activations_source: str = "none"

    @property
    def gpu_total(self) -> int:
        """Peak device bytes per GPU, overhead included."""
        return int(self.per_gpu["total"] or 0)

    @property
    def headroom(self) -> int:
        """GPU memory left at the peak (negative: does not fit)."""
        return self.gpu_memory - self.gpu_total

    @property
    def cpu_headroom(self) -> int:
        """Host memory left per node at its peak."""
        return self.cpu_memory - self.cpu_per_node["total"]

    @property
    def fits(self) -> bool:
        """True when both the GPU and the node's CPU memory hold the peak."""
        return self.headroom >= 0 and self.cpu_headroom >= 0

    def overflow_reason(self) -> str | None:
        """Why it does not fit: the memory that overflows, by how much, and its largest category."""
        if self.headroom < 0:
            largest = max(CATEGORIES, key=lambda name: self.per_gpu[name] or 0)
            return (
                f"GPU memory short by {-self.headroom} bytes at the {self.peak_phase} phase "
                f"(largest category: {largest})"
            )
        if self.cpu_headroom < 0:
            largest = max((k for k in self.cpu_per_node if k != "total"), key=self.cpu_per_node.__getitem__)
            return f"CPU memory per node short by {-self.cpu_headroom} bytes (largest: {largest})"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The ``dstune estimate --json`` object (DESIGN.md contract), plus phases and details."""
        return {
            "n_params": self.n_params,
            "architecture": self.architecture,
            "activations_source": self.activations_source,
            "world_size": self.world_size,
            "per_gpu": dict(self.per_gpu),
            "cpu_per_node": dict(self.cpu_per_node),
            "nvme_per_node": self.nvme_per_node,
            "gpu_memory": self.gpu_memory,
            "cpu_memory": self.cpu_memory,
            "fits": self.fits,
            "headroom": self.headroom,
            "cpu_headroom": self.cpu_headroom,
            "peak_phase": self.peak_phase,
            "phases": {name: {"gpu": phase.gpu_total, "cpu": phase.cpu_total} for name, phase in self.phases.items()},
            "details": dict(self.details),
            "reason": self.overflow_reason(),
        }


def estimate(workload: Workload, ds_config: dict[str, Any], overhead: Overhead = DEFAULT_OVERHEAD) -> MemoryEstimate:
    """Estimate the memory of training ``workload`` with ``ds_config`` under DeepSpeed 0.19.

    Example:
        >>> from tuner.workload import ClusterSpec, Workload, load_model
        >>> work = Workload(load_model("llama-2-7b"), ClusterSpec(gpus_per_node=8))
        >>> est = estimate(work, {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        ...                       "zero_optimization": {"stage": 3}})
        >>> est.fits, round(est.per_gpu["optimizer_states"] / 2**30, 1)
        (True, 9.4)
    """
    settings = resolve(workload, ds_config)
    return estimate_resolved(workload, settings, overhead)


def estimate_resolved(workload: Workload, s: Settings, overhead: Overhead = DEFAULT_OVERHEAD) -> MemoryEstimate:
    """:func:`estimate` for settings already resolved from a ds_config."""
    model, cluster, train = workload.model, workload.cluster, workload.train
    elem = s.param_bytes
    details: dict[str, int] = {}
    phases = {name: Phase() for name in PHASES}
    states = _stage3_states if s.stage == 3 else _flat_states
    nvme = states(workload, s, phases, details)

    activations = workload_activation_bytes(workload, s.micro_batch, s.precision, elem)
    known = activations is not None
    if activations is not None:
        saved, recompute, source = activations
        workspace = logits_workspace_bytes(model, s.micro_batch, train.seq_len, elem)
        details["logits_workspace"] = workspace
        details["recomputed_block"] = recompute
        phases["forward"].gpu["activations"] += saved
        phases["forward"].gpu["buffers"] += workspace
        phases["backward"].gpu["activations"] += recompute
    else:
        source = "none"

    gpu_totals = {name: phases[name].gpu_total for name in PHASES}
    peak_phase = max(gpu_totals, key=gpu_totals.__getitem__)
    peak = phases[peak_phase]
    per_gpu: dict[str, int | None] = dict(peak.gpu)
    if not known:
        per_gpu["activations"] = None
    device_overhead = 0
    if cluster.device == "cuda":
        terms = overhead.device_terms(gpu_totals[peak_phase], s.world_size, cluster.gpus_per_node)
        details.update(terms)
        device_overhead = sum(terms.values())
    per_gpu["overhead"] = device_overhead
    per_gpu["total"] = gpu_totals[peak_phase] + device_overhead

    process = overhead.cpu_process_cuda if cluster.device == "cuda" else overhead.cpu_process_cpu
    ranks = cluster.gpus_per_node
    host = [phase.cpu for phase in phases.values()]
    cpu_peak = max(sum(held.values()) for held in host)
    cpu_per_node = {
        name: ranks * max(held[name] for held in host)
        for name in ("parameters", "gradients", "optimizer_states", "buffers")
    }
    cpu_per_node["processes"] = ranks * process
    # Building the model adds no host bytes: measured runs build it where it trains (tuner.measure.birth). ZeRO-3
    # builds under deepspeed.zero.Init (each module's parameters created on the rank's device in the training dtype,
    # partitioned as soon as the module exists: the device briefly holds one module whole, the host nothing; with
    # offload_param the shards land in host memory the parameter phases already count), stages 0-2 directly on the
    # device in the training dtype. No rank holds the full fp32 copy on the host that used to cost 4·Ψ bytes per
    # rank (280 GB for a 70B model). Measured on CPU ranks: the resident set grows by e·Ψ/N while building
    # (tests/measure/test_birth.py).
    cpu_per_node["model_load"] = 0
    cpu_per_node["total"] = ranks * cpu_peak + cpu_per_node["processes"] + cpu_per_node["model_load"]
    return MemoryEstimate(
        n_params=model.n_params,
        world_size=s.world_size,
        phases=phases,
        peak_phase=peak_phase,
        per_gpu=per_gpu,
        cpu_per_node=cpu_per_node,
        nvme_per_node=nvme * ranks,
        gpu_memory=cluster.gpu_memory,
        cpu_memory=cluster.cpu_memory,
        details=details,
        activations_known=known,
        architecture=model.architecture or model.family,
        activations_source=source,
    )


def _add(phases: dict[str, Phase], where: str, category: str, size: int, only: tuple[str, ...] = PHASES) -> None:
    for name in only:
        getattr(phases[name], where)[category] += size


def _flat_states(workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int]) -> int:
    """Model states and buckets of ZeRO stages 0, 1 and 2 (no NVMe use)."""
    model, elem = workload.model, s.param_bytes
    mixed = s.precision != "fp32"
    if s.stage == 0:
        n = model.n_params
        _add(phases, "gpu", "parameters", elem * n)
        _add(phases, "gpu", "optimizer_states", (FP32 * n if mixed else 0) + ADAM_STATE_BYTES * n)
        _add(phases, "gpu", "gradients", elem * n, ("backward", "step"))
        if mixed:  # FP16_Optimizer builds fp32 gradients beside the 16-bit ones for the step
            _add(phases, "gpu", "gradients", FP32 * n, ("step",))
        return 0
    flat = flat_partition(model.param_numels, s.world_size)
    part = flat.partition
    worst_grads = part if model.is_bare else flat.worst_rank_grads
    details["partition_elements"] = part
    _add(phases, "gpu", "parameters", elem * flat.padded_total)
    states = (FP32 + ADAM_STATE_BYTES) * part
    bucket_phases: tuple[str, ...] = ("backward",)
    offload = s.offload_optimizer != "none"
    if s.contiguous_gradients or offload:
        copies = 2 if s.overlap_comm and (s.stage == 2 or not offload) else 1
        if offload and s.overlap_comm and not s.contiguous_gradients and s.grad_accum > 1:
            copies, bucket_phases = 2, PHASES  # measured: with accumulation this path keeps both between micro-steps
    else:
        copies = 0
    bucket = s.reduce_bucket_size * elem * copies
    details["reduce_buckets"] = bucket
    _add(phases, "gpu", "buffers", bucket, bucket_phases)
    if s.stage == 1:  # ZeRO-1 reduces after backward: every 16-bit gradient is alive first, offloaded or not
        _add(phases, "gpu", "gradients", elem * model.n_params, ("backward",))
    if s.offload_optimizer == "none":
        _add(phases, "gpu", "optimizer_states", states)
        if s.stage == 2:  # ZeRO-2 reduces as gradients arrive, into this rank's partition
            _add(phases, "gpu", "gradients", elem * worst_grads, ("backward",))
        _add(phases, "gpu", "gradients", FP32 * part, ("step",))
        return 0
    largest = model.largest_param
    _add(phases, "cpu", "optimizer_states", states)
    _add(phases, "cpu", "gradients", FP32 * part)  # fp32 gradient partition, pinned, always allocated
    _add(phases, "cpu", "buffers", elem * part + elem * largest)  # 16-bit param copy-back, grad staging
    _add(phases, "gpu", "buffers", elem * largest)  # device-side gradient staging buffer
    details["offload_staging"] = elem * part + 2 * elem * largest
    return 0


def _stage3_states(workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int]) -> int:
    """Model states and buffers of ZeRO stage 3; returns NVMe bytes per rank."""
    model, elem = workload.model, s.param_bytes
    part = stage3_partition(
        model.param_numels, s.world_size, s.param_persistence_threshold, s.model_persistence_threshold
    )
    shard, persistent = part.shard, part.persistent
    details["partition_elements"] = shard
    details["persistent_elements"] = persistent
    nvme = 0
    param_where = "gpu" if s.offload_param == "none" else "cpu"
    if s.offload_param == "nvme":
        nvme += elem * shard
        _add(phases, "cpu", "buffers", s.offload_param_buffer_count * s.offload_param_buffer_size * elem)
    else:
        _add(phases, param_where, "parameters", elem * shard)
    if s.world_size > 1 and not model.is_bare:
        _add_stage3_gathered(model.n_params, part.largest, persistent, elem, s, phases, details)
    bucket = s.reduce_bucket_size * elem if s.contiguous_gradients else 0
    details["reduce_buckets"] = bucket
    _add(phases, "gpu", "buffers", bucket)

    states = (FP32 + ADAM_STATE_BYTES) * shard
    step_grads = FP32 * min(shard, s.sub_group_size) if s.sub_group_size else FP32 * shard
    if s.offload_optimizer == "none":
        _add(phases, "gpu", "optimizer_states", states)
        _add(phases, "gpu", "gradients", elem * shard)  # the flat gradient partition buffer is permanent
        _add(phases, "gpu", "gradients", step_grads, ("step",))
    else:  # with offload the 16-bit gradient partition and its fp32 copy both live on the host for good
        _add(phases, "cpu", "gradients", (elem + FP32) * shard)
        if s.offload_optimizer == "nvme":
            nvme += states
            swap = s.offload_optimizer_buffer_count * min(shard, s.sub_group_size or shard) * FP32
            _add(phases, "cpu", "buffers", swap)
        else:
            _add(phases, "cpu", "optimizer_states", states)
    return nvme


def _add_stage3_gathered(
    n_params: int,
    largest: int,
    persistent: int,
    elem: int,
    s: Settings,
    phases: dict[str, Phase],
    details: dict[str, int],
) -> None:
    """Whole parameters ZeRO-3 holds beside the shards (on one rank the shard is the whole, so nothing).

    Persistent parameters stay whole through forward and backward; the step repartitions everything. After the
    forward pass DeepSpeed keeps the gathered parameters it will reuse within ``stage3_max_reuse_distance``
    (backward starts with the last layers), up to ``stage3_max_live_parameters``. While a module runs, it and the
    prefetch bucket are gathered too: that working set is transient (``stage3_working_set``).
    """
    _add(phases, "gpu", "parameters", elem * persistent, ("forward", "backward"))
    unpartitioned = n_params - persistent
    kept = min(unpartitioned, max(s.max_live_parameters, largest)) if s.max_reuse_distance >= largest else 0
    working = max(0, min(unpartitioned, largest + s.prefetch_bucket_size) - kept)
    details["gathered_parameters"] = elem * kept
    details["stage3_working_set"] = elem * working
    _add(phases, "gpu", "parameters", elem * kept, ("forward",))
    _add(phases, "gpu", "buffers", elem * working, ("forward",))
