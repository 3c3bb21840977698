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
recomputed block when checkpointing) and ``step`` (fp32 gradients). ZeRO-3 with
``stage3_gather_16bit_weights_on_model_save`` adds a fourth, ``save`` (:func:`_add_save_phase`): saving the model
gathers the whole 16-bit model on rank 0. Overhead on CUDA (named terms: CUDA context, NCCL communicators, cuBLAS
workspaces, the caching allocator's reserve, :mod:`.device`) is added on top of the
peak; its defaults are calibrated from measured runs later.

Host buffers DeepSpeed pins cost their size rounded up to a power of two on CUDA hosts (:mod:`.pinned`);
``cpu_per_node["pinned"]`` reports the page-locked bytes, which are part of the node's total, not added to it.

With a peft adapter or frozen parameters (``Workload.trainable``) the model is the model as trained (its profile
counts the peft model's parameters and which train): gradients, fp32 masters, optimizer states, flat groups and
reduce traffic cover the trainable parameters only; frozen weights are replicated in the training dtype at ZeRO 0-2
and partitioned at ZeRO-3, where peft's fp32 adapters stay fp32 (:mod:`.trainable`, measured with
``bench/peft_memory.py``). Backward's worst moments then come before the weight gradients
(:func:`_add_frozen_backward`).

Activations come from the workload's model profile when it carries one (traced from the real transformers model,
:mod:`tuner.profile`; plain data here, no torch), else from the built-in models' formulas
(:mod:`tuner.estimator.activations`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.estimator.activations import logits_workspace_bytes, workload_activation_bytes
from tuner.estimator.alloc_sequence import simulated_step
from tuner.estimator.attention import extra_bytes_per_layer
from tuner.estimator.device import KINDS, OTHER, DeviceKind
from tuner.estimator.hardware import table_key
from tuner.estimator.nccl import Parallelism
from tuner.estimator.partitions import flat_partition, round_robin_order, stage3_layout, stage3_partition
from tuner.estimator.phases import CATEGORIES, Phase
from tuner.estimator.pinned import HostPins
from tuner.estimator.quantized import (
    dequantized_weight_bytes,
    estimate_only_why,
    quantized_base,
    quantized_shard_bytes,
    stage3_view,
)
from tuner.estimator.settings import FP32, Settings, resolve
from tuner.estimator.trainable import TrainedParams, frozen_lead, stage3_bytes, trained_params
from tuner.estimator.transients import (
    bucket_chunks,
    flat_reduce_copy,
    optimizer_temporaries,
    stage3_reduce_copy,
    zero0_allreduce_copy,
)
from tuner.workload import TrialConfig, Workload

PHASES = ("forward", "backward", "step", "save")  # "save" only where the estimate has it (ZeRO-3, gather on save)
STEP_PHASES = PHASES[:3]
HOST_CATEGORIES = ("parameters", "gradients", "optimizer_states", "buffers")  # cpu_per_node's (no host activations)
CPU_VIEWS = frozenset({"total", "pinned"})  # cpu_per_node entries that are not categories of their own
ADAM_STATE_BYTES = 8  # two fp32 moments per parameter
UNSIMULATED_SHARE = 0.07  # the allocator's reserve for a config whose tensors cannot fit anyway (not simulated)


@dataclass(frozen=True)
class Overhead:
    """Memory outside the model's tensors, per rank.

    ``device``: the CUDA device kind whose named terms (CUDA context, one NCCL term per communicator, cuBLAS
    workspaces, allocator reserve: :mod:`tuner.estimator.device`) a CUDA estimate adds; None: the kind the
    workload's GPU memory suggests (:func:`tuner.estimator.hardware.table_key`: H200, H100 or A100).
    ``cpu_process``: resident bytes of one rank's process on the host (libraries, Python). CPU runs add no device
    terms.
    """

    cpu_process_cuda: int = 3 * 2**30
    cpu_process_cpu: int = 450 * 2**20
    device: DeviceKind | None = None

    def kind_for(self, workload: Workload) -> DeviceKind:
        """The device kind of a CUDA workload: the one given, else guessed from its GPU memory."""
        if self.device is not None:
            return self.device
        return KINDS.get(table_key(workload), OTHER)


DEFAULT_OVERHEAD = Overhead()


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
    overhead_terms: dict[str, int] = field(default_factory=dict)
    trainable_params: int | None = None  # None: every parameter trains (n_params)
    estimate_only: str = ""  # why no run here can check this estimate ("": one can)

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
            largest = max((k for k in self.cpu_per_node if k not in CPU_VIEWS), key=self.cpu_per_node.__getitem__)
            return f"CPU memory per node short by {-self.cpu_headroom} bytes (largest: {largest})"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The ``dstune estimate --json`` object (DESIGN.md contract), plus phases and details."""
        return {
            "n_params": self.n_params,
            "trainable_params": self.n_params if self.trainable_params is None else self.trainable_params,
            "estimate_only": bool(self.estimate_only),
            "estimate_only_why": self.estimate_only or None,
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
            "overhead_terms": dict(self.overhead_terms),
            "reason": self.overflow_reason(),
        }


def estimate(
    workload: Workload, trial: TrialConfig | Mapping[str, Any], overhead: Overhead = DEFAULT_OVERHEAD
) -> MemoryEstimate:
    """Estimate the memory of training ``workload`` with ``trial`` (a :class:`~tuner.workload.TrialConfig`, or a bare
    ds_config: no activation checkpointing) under DeepSpeed 0.19.

    Example:
        >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
        >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8))
        >>> est = estimate(work, {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        ...                       "zero_optimization": {"stage": 3}})
        >>> est.fits, round(est.per_gpu["optimizer_states"] / 2**30, 1)
        (True, 9.4)
    """
    settings = resolve(workload, trial)
    return estimate_resolved(workload, settings, overhead)


def estimate_resolved(workload: Workload, s: Settings, overhead: Overhead = DEFAULT_OVERHEAD) -> MemoryEstimate:
    """:func:`estimate` for settings already resolved from a trial config."""
    model, cluster, train = workload.model, workload.cluster, workload.train
    elem = s.param_bytes
    details: dict[str, int] = {}
    saving = s.stage == 3 and s.gather_16bit_on_save
    phases = {name: Phase() for name in (PHASES if saving else STEP_PHASES)}
    pins = HostPins(cuda=cluster.device == "cuda")
    states = _stage3_states if s.stage == 3 else _flat_states
    nvme = states(workload, s, phases, details, pins)
    gathered = _add_save_phase(workload, s, phases, details) if saving else 0

    params = trained_params(workload)
    if not params.is_full:
        details["trainable_elements"] = params.n_trainable
        details["frozen_elements"] = params.n_frozen
    base = quantized_base(workload, params)
    if base is not None:  # backward dequantizes each 4-bit weight whole, one at a time
        _add_transient(phases, details, "dequantized_weight", "backward", dequantized_weight_bytes(base, elem))
    # the model as trained is traced as ZeRO-3 trains it: peft's fp32 adapters kept (the engine casts them at stages
    # 0-2), and every Linear saving its input (zero.Init's memory-efficient linear: frozen weights' inputs too)
    adapters = ""
    if s.stage == 3 and not params.is_full:
        adapters = "zero3" if s.memory_efficient_linear else "fp32"
    activations = workload_activation_bytes(
        workload, s.micro_batch, s.precision, elem, s.activation_checkpointing, adapters
    )
    known = activations is not None
    if activations is not None:
        saved, recompute, source = activations
        workspace = logits_workspace_bytes(model, s.micro_batch, train.seq_len, elem)
        if cluster.device == "cuda":  # the CUDA attention kernels' padded log-sum-exp and RNG state
            kernel_extra = extra_bytes_per_layer(model, s.micro_batch, train.seq_len, s.precision, train.attention)
            if s.activation_checkpointing:  # only the recomputed block holds attention outputs
                recompute += kernel_extra
            else:
                kernel_extra *= model.num_layers
                saved += kernel_extra
            details["attention_kernel_extra"] = kernel_extra
        details["logits_workspace"] = workspace
        details["recomputed_block"] = recompute
        phases["forward"].gpu["activations"] += saved
        phases["forward"].gpu["buffers"] += workspace
        phases["backward"].gpu["activations"] += recompute
        if params.is_full:
            _add_early_backward(workload, s, phases, details, saved)
        else:
            _add_frozen_backward(workload, s, phases, details, saved)
    else:
        source = "none"

    gpu_totals = {name: phase.gpu_total for name, phase in phases.items()}
    peak_phase = max(gpu_totals, key=gpu_totals.__getitem__)
    peak = phases[peak_phase]
    per_gpu: dict[str, int | None] = dict(peak.gpu)
    if not known:
        per_gpu["activations"] = None
    device_overhead = 0
    terms: dict[str, int] = {}
    if cluster.device == "cuda":
        terms = _device_terms(workload, s, overhead.kind_for(workload), phases, details, gpu_totals[peak_phase])
        details.update(terms)
        details["nccl_buffers"] = sum(size for name, size in terms.items() if name.startswith("nccl_"))
        device_overhead = sum(terms.values())
    per_gpu["overhead"] = device_overhead
    per_gpu["total"] = gpu_totals[peak_phase] + device_overhead

    process = overhead.cpu_process_cuda if cluster.device == "cuda" else overhead.cpu_process_cpu
    ranks = cluster.gpus_per_node
    cpu_per_node, node_peak = _node_host(phases, ranks, gathered)
    cpu_per_node["processes"] = ranks * process
    # Building the model adds no host bytes: measured runs build it where it trains (tuner.measure.birth). ZeRO-3
    # builds under deepspeed.zero.Init (each module's parameters created on the rank's device in the training dtype,
    # partitioned as soon as the module exists: the device briefly holds one module whole, the host nothing; with
    # offload_param the shards land in host memory the parameter phases already count), stages 0-2 directly on the
    # device in the training dtype. No rank holds the full fp32 copy on the host that used to cost 4·Ψ bytes per
    # rank (280 GB for a 70B model). Measured on CPU ranks: the resident set grows by e·Ψ/N while building
    # (tests/measure/test_birth.py).
    cpu_per_node["model_load"] = 0
    cpu_per_node["total"] = node_peak + cpu_per_node["processes"] + cpu_per_node["model_load"]
    cpu_per_node["pinned"] = ranks * pins.pinned
    if pins.pinned:
        details["pinned_host"] = pins.pinned
        details["pinned_rounding"] = pins.rounding
    return MemoryEstimate(
        n_params=params.n_params,
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
        overhead_terms=terms,
        trainable_params=None if params.is_full else params.n_trainable,
        estimate_only=estimate_only_why(workload, s.quantized_nontrainable),
    )


def _device_terms(
    workload: Workload, s: Settings, kind: DeviceKind, phases: dict[str, Phase], details: dict[str, int], peak: int
) -> dict[str, int]:
    """The named CUDA overhead terms (:mod:`.device`), the allocator's reserve simulated on the step's plausible
    allocation sequence (:mod:`.alloc_sequence`) unless the kind sets a flat share. The simulation gets the GPU
    memory the context and NCCL leave as its capacity, so it releases cached segments where the real allocator
    would (before an out-of-memory error) rather than reporting a reserve no run could hold."""
    parallelism = Parallelism(
        world=s.world_size,
        gpus_per_node=workload.cluster.gpus_per_node,
        stage=s.stage,
        hpz=s.hpz_partition_size,
        sequence_parallel=s.sequence_parallel_size,
        expert_parallel=s.expert_parallel_size,
        quantized_gradients=s.quantized_gradients,
    )
    reserve = 0
    if kind.allocator_share is None:
        # The allocator may use what the context and NCCL leave; it releases its cache before running out.
        outside = kind.overhead(peak, parallelism)
        room = workload.cluster.gpu_memory - outside["cuda_context"]
        room -= sum(size for name, size in outside.items() if name.startswith("nccl_"))
        if peak + outside["cublas_workspace"] > room:  # cannot fit whatever the allocator does: no simulation
            details["allocator_out_of_memory"] = 1
            return kind.overhead(peak, parallelism, int(UNSIMULATED_SHARE * peak))
        simulated = simulated_step(workload, s, phases, details, s.expandable_segments, room)
        if simulated is None:  # out of memory even so: report the unpressured reserve (the total will not fit)
            details["allocator_out_of_memory"] = 1
            simulated = simulated_step(workload, s, phases, details, s.expandable_segments)
        assert simulated is not None  # no capacity: never out of memory
        details["simulated_peak_allocated"] = simulated.peak_allocated
        details["simulated_peak_reserved"] = simulated.peak_reserved
        details["allocator_cache_releases"] = simulated.releases
        reserve = simulated.reserve
    return kind.overhead(peak, parallelism, reserve)


def _add(phases: dict[str, Phase], where: str, category: str, size: int, only: tuple[str, ...] = PHASES) -> None:
    """Add ``size`` bytes to ``category`` in the phases ``only`` that the estimate has (default: all of them,
    for what stays allocated throughout)."""
    for name in only:
        if name in phases:
            getattr(phases[name], where)[category] += size


def _node_host(phases: dict[str, Phase], ranks: int, gathered: int) -> tuple[dict[str, int], int]:
    """The worst node's host bytes: the largest of each category over the phases, and the peak of their sums.

    Every rank holds its phase's host bytes, except that in the ``save`` phase only rank 0 holds the ``gathered``
    model.
    """
    held = [phase.cpu for name, phase in phases.items() if name != "save"]
    by_category = {name: ranks * max(host[name] for host in held) for name in HOST_CATEGORIES}
    peak = ranks * max(sum(host.values()) for host in held)
    if "save" in phases:
        save = phases["save"].cpu
        for name in HOST_CATEGORIES:
            size = ranks * save[name] - ((ranks - 1) * gathered if name == "parameters" else 0)
            by_category[name] = max(by_category[name], size)
        peak = max(peak, ranks * sum(save.values()) - (ranks - 1) * gathered)
    return by_category, peak


def _flat_states(
    workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int], pins: HostPins
) -> int:
    """Model states and buckets of ZeRO stages 0, 1 and 2 (no NVMe use).

    ``round_robin_gradients`` reorders the flat buffer (:func:`.round_robin_order`): the sizes are unchanged, only
    which parameters straddle a partition boundary, so it moves ZeRO-2's worst-rank gradient buffer a little. With
    optimizer offload (where it is meant to be used) nothing estimated depends on the order.
    """
    model, elem = workload.model, s.param_bytes
    mixed = s.precision != "fp32"
    params = trained_params(workload)  # frozen parameters: no gradients, masters or optimizer states
    frozen = elem * params.n_frozen  # whole on every rank, in the training dtype, outside the flat groups
    base = quantized_base(workload, params)
    if base is not None:  # 4-bit weights: packed data and quant state instead, whole on every rank too
        frozen += base.packed + base.state - elem * base.elements
        details["quantized_weights"] = base.packed + base.state
    if s.stage == 0:
        n = params.n_trainable
        _add(phases, "gpu", "parameters", elem * n + frozen)
        _add(phases, "gpu", "optimizer_states", (FP32 * n if mixed else 0) + ADAM_STATE_BYTES * n)
        _add(phases, "gpu", "gradients", elem * n, ("backward", "step"))
        if mixed:  # FP16_Optimizer builds fp32 gradients beside the 16-bit ones for the step
            _add(phases, "gpu", "gradients", FP32 * n, ("step",))
        _add_transient(phases, details, "allreduce_copy", "backward", zero0_allreduce_copy(params.trainable, elem))
        largest = n if mixed else params.largest_trainable
        step = optimizer_temporaries(s.optimizer_impl, largest, n)
        if mixed:  # FP16_Optimizer.step: every p.grad.to(fp32) alive in a list while they are concatenated
            step = max(step, FP32 * n)
        _add_transient(phases, details, "step_temporaries", "step", step)
        return 0
    numels = params.trainable
    if s.round_robin_gradients and s.world_size > 1:
        numels = round_robin_order(numels, s.world_size)
    flat = flat_partition(numels, s.world_size)
    part = flat.partition
    worst_grads = part if model.is_bare else flat.worst_rank_grads
    details["partition_elements"] = part
    _add(phases, "gpu", "parameters", elem * flat.padded_total + frozen)
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
        _add(phases, "gpu", "gradients", elem * params.n_trainable, ("backward",))
    if s.offload_optimizer == "none":
        _add(phases, "gpu", "optimizer_states", states)
        if s.stage == 2:  # ZeRO-2 reduces as gradients arrive, into this rank's partition
            _add(phases, "gpu", "gradients", elem * worst_grads, ("backward",))
        _add(phases, "gpu", "gradients", FP32 * part, ("step",))
        _add_transient(
            phases, details, "reduce_copy", "backward", _reduce_copy(workload, s, numels, elem * worst_grads)
        )
        _add_transient(
            phases, details, "optimizer_temporaries", "step", optimizer_temporaries(s.optimizer_impl, part, part)
        )
        return 0
    largest = params.largest_trainable
    pin = s.offload_optimizer_pin
    master = pins.size(FP32 * part, pin)  # the fp32 master partition; Adam's moments are pageable
    _add(phases, "cpu", "optimizer_states", master + ADAM_STATE_BYTES * part)
    _add(phases, "cpu", "gradients", pins.size(FP32 * part, pin))  # fp32 gradient partition, always allocated
    staging = pins.size(elem * part, pin) + pins.size(elem * largest, pin)  # 16-bit param copy-back, grad staging
    _add(phases, "cpu", "buffers", staging)
    _add(phases, "gpu", "buffers", elem * largest)  # device-side gradient staging buffer
    details["offload_staging"] = elem * part + 2 * elem * largest
    return 0


def _add_transient(phases: dict[str, Phase], details: dict[str, int], name: str, phase: str, size: int) -> None:
    """A transient buffer (:mod:`.transients`) of ``size`` bytes at its worst moment in ``phase``, on the device."""
    if size:
        details[name] = size
        details[f"transients_{phase}"] = details.get(f"transients_{phase}", 0) + size
        _add(phases, "gpu", "buffers", size, (phase,))


def _reduce_copy(workload: Workload, s: Settings, numels: tuple[int, ...], partition_grads: int) -> int:
    """ZeRO-1/2's flattened bucket copy beyond what the backward phase holds (:func:`.flat_reduce_copy`).

    ZeRO-2's backward phase holds the gradient partition; ZeRO-1's holds every 16-bit gradient, which its
    after-backward reduction frees as it copies them into buckets, so only the partition allocated after the first
    bucket can add to it.
    """
    model, elem = workload.model, s.param_bytes
    if model.is_bare or not s.reduce_scatter:
        return 0
    if s.stage == 2:
        return flat_reduce_copy(
            numels, s.reduce_bucket_size, elem, partition_grads, s.world_size, s.multi_rank_bucket_allreduce
        )
    chunks = bucket_chunks(numels, s.reduce_bucket_size)
    return max(0, partition_grads - elem * chunks[0]) if len(chunks) > 1 else 0


def _add_frozen_backward(
    workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int], saved: int
) -> None:
    """Backward's worst moments when few parameters train (measured, ``bench/peft_memory.py``): their gradients
    are too small to matter, so the peak comes before them.

    * The loss's backward, before any gradient reaches a weight: beside every saved activation and the logits
      workspace, one more logits-sized tensor in the training dtype (``e·b·s·V``, the gradient of the logits on
      its way back through the LM head: ``details["loss_backward"]``), counted in the forward phase.
    * The first trainable gradient arrives in the last layer's backward, when ZeRO 1-3 allocate their reduce
      bucket: the saved activations of every other layer are still alive (``(L-1)/L`` of them:
      ``details["early_backward_activations"]``), counted in the backward phase beside the bucket.
    """
    model, train, elem = workload.model, workload.train, s.param_bytes
    head = elem * s.micro_batch * train.seq_len * model.vocab_size
    details["loss_backward"] = head
    phases["forward"].gpu["buffers"] += head
    layers = max(1, model.num_layers)
    if s.stage and s.offload_optimizer == "none":
        alive = saved * (layers - 1) // layers
        details["early_backward_activations"] = alive
        phases["backward"].gpu["activations"] += alive


def _add_early_backward(
    workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int], saved: int
) -> None:
    """The backward phase's worst moment can come early: when the first gradient bucket is reduced, most saved
    activations are still alive beside the buckets (and, from then on, ZeRO-2's gradient partition).

    Used when backward reduces more than one bucket (with one bucket the reduction happens at the end, after the
    activations are gone). The activations still alive are taken in proportion to the parameters whose gradients
    have not arrived yet (``1 - first bucket / Ψ``); what that moment holds beyond the backward phase's end is
    added to its activations (``details["early_backward_activations"]``).
    """
    model, elem = workload.model, s.param_bytes
    if model.is_bare or s.stage not in (2, 3) or s.offload_optimizer != "none" or not s.reduce_scatter:
        return
    params = trained_params(workload)  # gradients arrive for the trainable parameters only
    chunks = bucket_chunks(params.trainable, s.reduce_bucket_size)
    total = params.n_trainable
    if len(chunks) < 2 or not total:
        return
    alive = saved * (total - chunks[0]) // total
    first = elem * chunks[0]
    if s.stage == 2:  # the partition (already in the phase) is allocated right after the first bucket's reduction
        partition = phases["backward"].gpu["gradients"]
        early = alive + max(first, partition) - partition
    else:  # ZeRO-3: the first bucket's reduce-scatter staging beside the permanent partition (gloo: twice)
        early = alive + first * (2 if workload.cluster.device == "cpu" else 1)
    extra = max(0, early - details.get("reduce_copy", 0))
    if extra:
        details["early_backward_activations"] = extra
        phases["backward"].gpu["activations"] += extra


def _stage3_states(
    workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int], pins: HostPins
) -> int:
    """Model states and buffers of ZeRO stage 3; returns NVMe bytes per rank."""
    model, elem = workload.model, s.param_bytes
    params = trained_params(workload)
    base, whole = quantized_base(workload, params), 0
    if base is not None:  # 4-bit weights as ZeRO-3 holds them: partitioned packed data, or whole (uint8)
        params, whole = stage3_view(params, base, elem)
        details["quantized_weights_whole"] = whole
        _add(phases, "gpu", "parameters", whole)
    part = stage3_partition(params.numels, s.world_size, s.param_persistence_threshold, s.model_persistence_threshold)
    shard, persistent = part.shard, part.persistent
    details["partition_elements"] = shard
    details["persistent_elements"] = persistent
    shard_bytes, upcast = elem * shard, 0  # frozen parameters are partitioned like the rest
    if not params.is_full:  # peft's fp32 adapters stay fp32; only the trainable shard has gradients and states
        held = stage3_bytes(params, s.world_size, elem, s.param_persistence_threshold, s.model_persistence_threshold)
        shard_bytes, upcast = held.shard_bytes, held.persistent_bytes - elem * persistent
        shard = held.trainable_shard
        details["trainable_partition_elements"] = shard
        if s.quantized_nontrainable:  # frozen shards held int8 with fp32 scales
            saved = _quantized_nontrainable_saving(params, s, elem)
            details["quantized_nontrainable_saving"] = saved
            shard_bytes -= saved
    nvme = 0
    if s.offload_param == "nvme":
        nvme += shard_bytes
        _add(phases, "cpu", "buffers", pins.locked(s.offload_param_buffer_count * s.offload_param_buffer_size * elem))
    elif s.offload_param == "cpu":  # one flat buffer, pinned whatever offload_param.pin_memory says
        _add(phases, "cpu", "parameters", pins.size(shard_bytes, True))
    else:
        _add(phases, "gpu", "parameters", shard_bytes)
    if s.world_size > 1 and not model.is_bare:
        _, persists = stage3_layout(
            params.numels, s.world_size, s.param_persistence_threshold, s.model_persistence_threshold
        )
        # a tied embedding is the LM head too, which backward does run
        unused = 0 if model.tie_embeddings else frozen_lead(params, persists)
        _add_stage3_gathered(
            params.n_params - unused, part.largest, persistent, elem, s, phases, details, _expert_modules(workload)
        )
        _add(phases, "gpu", "parameters", upcast, ("forward", "backward"))  # fp32 adapters' whole copies
    bucket = s.reduce_bucket_size * elem if s.contiguous_gradients else 0
    details["reduce_buckets"] = bucket
    _add(phases, "gpu", "buffers", bucket)
    if not model.is_bare:
        _add_transient(
            phases,
            details,
            "reduce_copy",
            "backward",
            stage3_reduce_copy(params.trainable, s, elem, workload.cluster.device == "cpu"),
        )

    states = (FP32 + ADAM_STATE_BYTES) * shard
    step_grads = FP32 * min(shard, s.sub_group_size) if s.sub_group_size else FP32 * shard
    if s.offload_optimizer == "none":
        _add(phases, "gpu", "optimizer_states", states)
        _add(phases, "gpu", "gradients", elem * shard)  # the flat gradient partition buffer is permanent
        _add(phases, "gpu", "gradients", step_grads, ("step",))
        group = min(shard, s.sub_group_size) if s.sub_group_size else shard
        _add_transient(
            phases, details, "optimizer_temporaries", "step", optimizer_temporaries(s.optimizer_impl, group, shard)
        )
    else:  # with offload the 16-bit gradient partition and its fp32 copy both live on the host for good
        pin = s.offload_optimizer_pin
        _add(phases, "cpu", "gradients", pins.size(elem * shard, pin) + _sub_group_grads(shard, s, pins))
        if s.offload_optimizer == "nvme":
            nvme += states
            swap = s.offload_optimizer_buffer_count * min(shard, s.sub_group_size or shard) * FP32
            _add(phases, "cpu", "buffers", pins.locked(swap))
        else:
            _add(phases, "cpu", "optimizer_states", states)
    return nvme


def _quantized_nontrainable_saving(params: TrainedParams, s: Settings, elem: int) -> int:
    """Bytes ``zero_quantized_nontrainable_weights`` saves per rank: each frozen shard int8 with its fp32 scales
    (:func:`.quantized_shard_bytes`) instead of its dtype."""
    parts, _ = stage3_layout(params.numels, s.world_size, s.param_persistence_threshold, s.model_persistence_threshold)
    upcast = params.fp32 or (False,) * len(parts)
    saved = 0
    for part, train, up in zip(parts, params.mask, upcast, strict=True):
        if not train:
            saved += (FP32 if up else elem) * part - quantized_shard_bytes(part)
    return saved


def _expert_modules(workload: Workload) -> bool:
    """True when the workload's model profile says its MoE experts are modules of their own, run only for the
    tokens routed to them (unknown without a profile: False, as transformers 5 fuses most MoEs' experts)."""
    profile = workload.profile
    return profile is not None and profile.expert_modules


def _add_stage3_gathered(
    n_params: int,
    largest: int,
    persistent: int,
    elem: int,
    s: Settings,
    phases: dict[str, Phase],
    details: dict[str, int],
    expert_modules: bool = False,
) -> None:
    """Whole parameters ZeRO-3 holds beside the shards (on one rank the shard is the whole, so nothing).

    ``n_params``: the elements backward revisits (those of modules it never runs, a LoRA model's frozen embedding,
    are released after use). Persistent parameters stay whole through forward and backward; the step repartitions
    everything. Once a step has recorded the order modules run in (a complete trace, from the second step on),
    DeepSpeed keeps after the forward pass the gathered parameters it will reuse within ``stage3_max_reuse_distance``
    (backward starts with the last layers), up to ``stage3_max_live_parameters``; backward releases them module by
    module, so none is left by its last reduction (:func:`.stage3_reduce_copy`). While a module runs, it and the
    prefetch bucket are gathered too: that working set is transient (``stage3_working_set``).

    Measured on 2 CPU ranks with the counting allocator (both ranks' peaks agree to the byte): LoRA on a tiny
    Mixtral-shaped MoE with small buckets peaks in the loss's backward holding every expert stack and the LM head
    gathered (DeepSpeed's own parameter states at that moment: 1,703,936 elements ``AVAILABLE``); the 100M-parameter
    models with one bucket hold none of them at their backward peak. transformers 5 fuses an MoE's experts into one
    module that runs every step, so its module order is as static as a dense model's.

    With ``expert_modules`` (experts that are modules of their own, run only for the tokens routed to them) the
    module order changes every step: DeepSpeed drops its trace and releases each module's parameters after use
    (``release_sub_module`` without a complete trace), so forward keeps nothing (read in DeepSpeed's code, not
    measured here).
    """
    _add(phases, "gpu", "parameters", elem * persistent, ("forward", "backward"))
    unpartitioned = n_params - persistent
    kept = min(unpartitioned, max(s.max_live_parameters, largest)) if s.max_reuse_distance >= largest else 0
    if expert_modules:
        kept = 0
    working = max(0, min(unpartitioned, largest + s.prefetch_bucket_size) - kept)
    details["gathered_parameters"] = elem * kept
    details["stage3_working_set"] = elem * working
    _add(phases, "gpu", "parameters", elem * kept, ("forward",))
    _add(phases, "gpu", "buffers", elem * working, ("forward",))


def _add_save_phase(workload: Workload, s: Settings, phases: dict[str, Phase], details: dict[str, int]) -> int:
    """The ``save`` phase of ZeRO-3 with ``stage3_gather_16bit_weights_on_model_save``; returns the bytes gathered.

    ``save_16bit_model`` calls ``_zero3_consolidated_16bit_state_dict`` (``deepspeed/runtime/engine.py:5631``) on
    every rank between steps: it gathers one module's parameters at a time (``GatheredParameters`` on every rank's
    device) and rank 0 copies each into a host ``state_dict`` (``param.detach().cpu()``), so rank 0's host ends up
    holding the whole model in the training dtype, ``e·Ψ`` (tied weights once), beside the steady state: shards,
    optimizer states, the permanent gradient partition and reduce bucket (no activations, no fp32 step gradients).
    The device adds the module being gathered (its largest parameter); on CPU ranks the gathered storages are the
    state_dict's own (``.cpu()`` copies nothing), so nothing is added beyond ``e·Ψ``. Measured on 2 CPU ranks
    (``tests/estimator/test_save_deepspeed.py``): rank 0's state_dict holds exactly ``e·Ψ`` in storages no live
    parameter shares, persistent parameters included. The phase's host bytes are rank 0's (the worst rank); on the
    node only rank 0 holds the model.
    """
    model, elem = workload.model, s.param_bytes
    gathered = elem * model.n_params
    base = quantized_base(workload, trained_params(workload))
    if base is not None:  # 4-bit weights are gathered as their packed data
        gathered += base.packed - elem * base.elements
    working = elem * model.largest_param if workload.cluster.device == "cuda" else 0
    details["save_gathered_model"] = gathered
    details["save_working_set"] = working
    _add(phases, "cpu", "parameters", gathered, ("save",))
    _add(phases, "gpu", "buffers", working, ("save",))
    return gathered


def _sub_group_grads(shard: int, s: Settings, pins: HostPins) -> int:
    """Host bytes of ZeRO-3's fp32 gradient buffers with optimizer offload: one per sub-group of ``sub_group_size``
    elements (the shard cut into equal sub-groups, as the step's fp32 gradients are sized), each pinned alone."""
    group = min(shard, s.sub_group_size) if s.sub_group_size else shard
    if group == 0:
        return 0
    full, rest = divmod(shard, group)
    pin = s.offload_optimizer_pin and s.offload_optimizer == "cpu"  # NVMe steps swapped sub-groups in one buffer
    return pins.size(FP32 * group, pin, count=full) + pins.size(FP32 * rest, pin)
