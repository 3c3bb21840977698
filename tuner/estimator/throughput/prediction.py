"""Predicted step time and tokens/s of a workload under a ds_config (pure arithmetic, alongside the memory estimate).

One optimizer step on one rank is ``A`` micro-steps (gradient accumulation) of micro-batch ``b`` at sequence ``s``,
then the step. Its time is a sum of five terms, each a volume over a rate of
:class:`~tuner.estimator.throughput.hardware.Hardware`:

* ``compute``: model FLOPs per token (:func:`tuner.estimator.throughput.flops.model_flops_per_token`: 6·Ψ plus attention
  scores; 4·Ψ + 2·T when only T parameters train, LoRA or frozen layers) × tokens, plus one more forward pass under
  full activation checkpointing (×4/3 when all train), over the sustained FLOP/s.
* ``launch``: a fixed cost per layer per micro-step (×4/3 with recomputation) and per step.
* ``bandwidth``: ZeRO communication in ring collectives, ``(N-1)/N`` of the buffer per rank for a reduce-scatter or an
  all-gather, twice that for an all-reduce, over the intra-node link (inter-node on several nodes). ZeRO-0
  all-reduces gradients once per step. ZeRO-1/2 (DeepSpeed 0.19 reduces into partitions during backward for
  both) reduce-scatter gradients every micro-step and all-gather the updated 16-bit parameters after the
  step. ZeRO-3 gathers the parameters above ``stage3_param_persistence_threshold`` in forward, backward and the
  recomputed forward, and reduce-scatters gradients every micro-step.
* ``hpZ`` (ZeRO++ hierarchical partitioning, ``zero_hpz_partition_size`` = g at ZeRO-3): the gathers from the
  secondary partition run within groups of g ranks, over the node's links (:func:`zero3_gather_seconds`).
* ``qwZ`` / ``qgZ`` (ZeRO++ quantized weights and gradients at ZeRO-3): the parameter gathers move int8 (about half
  the 16-bit bytes) and the gradient reduction runs int4 all-to-alls within and across nodes (a quarter of the
  bytes within the node, a quarter of ``1/L`` across), four calls per gradient tensor (:mod:`.layouts.zeropp`).
* ``tensor parallel`` (AutoTP): each rank computes with its shards, ZeRO works over ``world / tp`` ranks, and
  every layer all-reduces its outputs and input gradients within the node
  (:func:`.layouts.autotp.tensor_parallel_seconds`, in ``bandwidth`` and ``latency``).
* ``expert parallel`` (AutoEP): each rank holds and reduces its ``experts / ep`` (the gradient traffic of the rank's
  parameters), computes as many routed rows as without it, and every MoE layer dispatches and combines its routed
  tokens by all-to-all in forward and backward (:func:`.layouts.autoep.expert_parallel_seconds`).
  Both come through the layout registry (:func:`_layout_collectives`).
* ``latency``: a fixed cost per collective call, one per reduce/all-gather bucket, per gathered ZeRO-3 parameter
  and pass (its hooks run even on one rank), and the gradient-norm all-reduce.
* ``memory``: the optimizer step's memory traffic (about 32 B per trainable parameter of the rank's partition) over
  device memory bandwidth, the gradient copies into ZeRO-1/2 buckets, and offload: CPU-Adam over the host's rate,
  gradients down and parameters up over PCIe, ZeRO-3 offloaded parameters up once per gather pass.

With ``overlap_comm`` the bytes sent during backward (gradient reduction; ZeRO-3 prefetch) hide behind the backward
pass (two thirds of the compute when every parameter trains): only what exceeds it counts; per-call latency (hooks,
launches) is never hidden.
Multiplicative factors per term, fitted from measured runs per hardware kind (:mod:`tuner.forecast`),
scale each term; 1 is the table. FLOPs per token and peak FLOP/s are :mod:`tuner.measure.measurement`'s (a pure
module; its package imports nothing), so predicted and measured TFLOP/s and MFU count the same FLOPs.

Example:
    >>> from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model
    >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=4096))
    >>> p = predict(work, {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
    ...                    "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}})
    >>> p.bound, round(p.tokens_per_s / 8)
    ('compute', 9656)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.estimator.layouts import active
from tuner.estimator.layouts.autoep import ep_workload
from tuner.estimator.layouts.autotp import tp_workload
from tuner.estimator.layouts.ulysses import all_to_all_bytes, mlp_params
from tuner.estimator.layouts.zeropp import QGZ_CALLS_PER_TENSOR, gathered_bytes_per_element, qgz_seconds
from tuner.estimator.settings import Settings, resolve
from tuner.estimator.states.trainable import trained_params
from tuner.estimator.throughput.flops import (
    backward_flops_per_token,
    forward_flops_per_token,
    model_flops_per_token,
    peak_tflops,
)
from tuner.estimator.throughput.hardware import Hardware, hardware_for, table_key
from tuner.workload import ModelSpec, TrialConfig, Workload

TERMS = ("compute", "launch", "bandwidth", "latency", "memory")
RECOMPUTE = 4 / 3  # full checkpointing runs the forward pass twice: (2 + 4 + 2) / (2 + 4) of the FLOPs, launches
ADAM_BYTES = 32  # per parameter: read master, gradient, two moments (fp32), write three of them and the 16-bit copy


@dataclass(frozen=True)
class StepTerms:
    """Seconds per optimizer step at the table's rates, by term; ``hideable`` is the share of ``bandwidth`` issued
    during backward, ``cover`` the backward compute it may hide behind (0 without overlap_comm). Latency (calls,
    hooks) is host work and never hidden.
    """

    compute: float
    launch: float
    bandwidth: float
    latency: float
    memory: float
    hideable: float = 0.0
    cover: float = 0.0

    def values(self) -> tuple[float, ...]:
        """The five terms in :data:`TERMS` order."""
        return self.compute, self.launch, self.bandwidth, self.latency, self.memory

    def step_time(self, factors: Mapping[str, float] | None = None) -> float:
        """Seconds per optimizer step with each term scaled by ``factors`` (missing: 1)."""
        f = factors or {}
        compute = self.compute * f.get("compute", 1.0)
        transfer = self.bandwidth * f.get("bandwidth", 1.0)
        hidden = min(transfer * self.hideable, self.cover * f.get("compute", 1.0))
        fixed = self.launch * f.get("launch", 1.0) + self.latency * f.get("latency", 1.0)
        return compute + fixed + transfer - hidden + self.memory * f.get("memory", 1.0)

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return {name: getattr(self, name) for name in (*TERMS, "hideable", "cover")}

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> StepTerms:
        """The inverse of :meth:`to_dict`."""
        return cls(**{name: float(data.get(name, 0.0)) for name in (*TERMS, "hideable", "cover")})


@dataclass(frozen=True)
class ThroughputPrediction:
    """What one config is predicted to do. ``factors`` are the fitted constants used (empty: the table)."""

    hardware: str
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    tflops_per_device: float
    mfu: float | None
    bound: str
    terms: StepTerms
    factors: dict[str, float]

    def to_dict(self, fit_runs: int = 0, error: float | None = None) -> dict[str, Any]:
        """The ``throughput`` object of ``dstune estimate --json`` (times in seconds per optimizer step).

        ``fit_runs``: the measured runs behind ``factors`` (0: the hardware table); ``error``: their median
        out-of-sample relative error of step time (null before any run)."""
        f = self.factors
        scaled = {name: value * f.get(name, 1.0) for name, value in zip(TERMS, self.terms.values(), strict=True)}
        return {
            "hardware": self.hardware,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
            "bound": self.bound,
            "terms_s": scaled,
            "factors": dict(self.factors),
            "fitted": bool(self.factors),
            "fit_runs": fit_runs,
            "error": error,
        }


def trainable_params(workload: Workload) -> int:
    """The parameters that train (gradients, optimizer states, their communication): all ``n_params`` for full
    fine-tuning, else what the adapter and the freeze pattern leave trainable in the profile of the model as trained
    (:func:`tuner.estimator.states.trainable.trained_params`: peft's count)."""
    if workload.trainable.is_full:
        return workload.model.n_params
    return trained_params(workload).n_trainable


def all_params(workload: Workload) -> int:
    """Every parameter of the model as trained: with an adapter, the base's and the adapter's."""
    if workload.trainable.is_full:
        return workload.model.n_params
    return trained_params(workload).n_params


def step_terms(workload: Workload, s: Settings, hw: Hardware) -> StepTerms:
    """The five terms (seconds per optimizer step at the table's rates) for resolved settings.

    Gradients, their reduction, the optimizer step and offload traffic scale with the trainable parameters
    (:func:`trainable_params`); the forward, the activation gradients and ZeRO-3's parameter gathers with all of
    them (frozen weights are partitioned like the rest under ZeRO-3, replicated outside the flat groups under
    ZeRO-1/2, so they are neither reduced nor gathered there)."""
    workload = tp_workload(workload, s)  # AutoTP: a rank computes with, reduces and gathers its shards
    # AutoEP: a rank holds, reduces and gathers its local experts, and computes as many routed rows as without it
    flops_model, workload = workload.model, ep_workload(workload, s)
    model = workload.model
    world, nodes = s.zero_ranks, workload.cluster.nodes
    psi, elem, accum = all_params(workload), s.param_bytes, s.grad_accum
    numels = model.param_numels if workload.trainable.is_full else trained_params(workload).numels
    trained = trainable_params(workload)
    checkpointed = s.activation_checkpointing and not model.is_bare
    redo = RECOMPUTE if checkpointed else 1.0
    flops_rate = hw.flops / (hw.fp32_slowdown if s.precision == "fp32" else 1.0)
    forward, backward = _micro_batch_flops(flops_model, workload, s, trained)
    sp_compute, sp_seconds, sp_calls = long_context_seconds(workload, s, hw, flops_rate)
    compute = accum * (forward * (2 if checkpointed else 1) + backward) / flops_rate + sp_compute
    layers = model.num_layers + 1
    launch = hw.launch_s * layers * (accum * redo + 1)

    link = hw.inter_bw if nodes > 1 else hw.intra_bw
    ring = (world - 1) / world
    partition = psi if s.stage == 0 else math.ceil(psi / world)
    trained_partition = trained if s.stage == 0 else math.ceil(trained / world)
    reduce_calls = math.ceil(trained / s.reduce_bucket_size)
    per_micro_bytes = step_bytes = gather_seconds = 0.0
    per_micro_calls = step_calls = 1.0  # the gradient-norm all-reduce (clipping, overflow check)
    memory = ADAM_BYTES * trained_partition / hw.memory_bw
    if s.stage == 0:
        step_bytes = 2 * ring * elem * trained
        step_calls += reduce_calls
    elif s.stage in (1, 2):
        per_micro_bytes = ring * elem * trained
        per_micro_calls = reduce_calls
        step_bytes = ring * elem * trained
        step_calls += math.ceil(trained / max(1, s.allgather_bucket_size))
        memory += accum * elem * trained / hw.memory_bw  # gradients copied into the reduce buckets
    else:
        gather_seconds, per_micro_bytes, per_micro_calls = _zero3_comm(workload, s, hw, numels, psi, trained)
        if s.offload_param != "none":
            memory += accum * zero3_passes(s) * elem * partition / hw.host_bw
    if s.offload_optimizer != "none":
        memory += trained_partition / hw.cpu_adam_params_s - ADAM_BYTES * trained_partition / hw.memory_bw
        memory += 2 * elem * trained_partition / hw.host_bw  # gradients down, updated parameters up
    tp_seconds, tp_calls = _layout_collectives(workload, s, hw)  # AutoTP's all-reduces, AutoEP's all-to-alls
    bandwidth = accum * per_micro_bytes / link + gather_seconds + step_bytes / link + sp_seconds + tp_seconds
    latency = (accum * per_micro_calls + step_calls + sp_calls + tp_calls) * hw.collective_s
    hideable = (accum * per_micro_bytes / link + gather_seconds) / bandwidth if s.overlap_comm and bandwidth else 0.0
    cover = backward / (forward + backward) * compute if s.overlap_comm else 0.0  # backward's share: 2/3 when all train
    return StepTerms(compute, launch, bandwidth, latency, memory, hideable, cover)


def _layout_collectives(workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
    """(seconds, calls) per optimizer step of the collectives the trial's layouts add that nothing overlaps
    (:meth:`tuner.estimator.layouts.base.LayoutTerms.collective_seconds`)."""
    seconds, calls = 0.0, 0
    for layout in active(s.ranks):
        more, count = layout.collective_seconds(workload, s, hw)
        seconds, calls = seconds + more, calls + count
    return seconds, calls


def zero3_passes(s: Settings) -> int:
    """How many times a micro-step gathers ZeRO-3's parameters: forward, backward and a recomputed forward."""
    return 2 + (1 if s.activation_checkpointing else 0)


def _zero3_comm(
    workload: Workload, s: Settings, hw: Hardware, numels: tuple[int, ...], psi: int, trained: int
) -> tuple[float, float, float]:
    """ZeRO-3 per optimizer step: seconds of the parameter gathers (with qgZ's gradient all-to-alls), the bytes one
    micro-step's gradient reduce-scatter sends (none under qgZ) and one micro-step's collective calls."""
    passes, world = zero3_passes(s), s.zero_ranks
    gathers = zero3_gather_seconds(workload, s, hw, numels, psi, passes)
    if s.quantized_gradients:  # qgZ: int4 all-to-alls within and across nodes, per tensor (.layouts.zeropp)
        local = workload.cluster.gpus_per_node
        qgz = s.grad_accum * qgz_seconds(trained, world, local, hw.intra_bw, hw.inter_bw)
        return gathers + qgz, 0.0, float((passes + QGZ_CALLS_PER_TENSOR) * len(numels))
    reduce_calls = math.ceil(trained / s.reduce_bucket_size)
    return gathers, (world - 1) / world * s.param_bytes * trained, float(passes * len(numels) + reduce_calls)


def _micro_batch_flops(model: ModelSpec, workload: Workload, s: Settings, trained: int) -> tuple[float, float]:
    """Forward and backward FLOPs of one micro-batch of a rank's tokens (``s/sp`` each under Ulysses) through
    ``model``, ``trained`` of whose parameters train."""
    tokens = s.micro_batch * workload.train.seq_len // s.ranks.sequence
    trainable = None if workload.trainable.is_full else trained
    forward = forward_flops_per_token(model, workload.train.seq_len) * tokens
    return forward, backward_flops_per_token(model, workload.train.seq_len, trainable) * tokens


def zero3_gather_seconds(
    workload: Workload, s: Settings, hw: Hardware, numels: tuple[int, ...], psi: int, passes: int
) -> float:
    """Seconds per optimizer step of ZeRO-3's parameter all-gathers: the parameters above
    ``stage3_param_persistence_threshold`` (of ``psi``; ``numels`` each parameter's), whole, in every one of the
    ``passes`` of every micro-step; ring all-gathers, ``(N-1)/N`` of the bytes over the link between the ZeRO ranks.

    hpZ (``zero_hpz_partition_size`` = g > 1). Where the figure comes from: ZeRO++ (Wang et al., arXiv 2306.10209,
    hpZ) keeps a secondary copy of the 16-bit parameters partitioned within each node so that the backward
    all-gather runs over the node's links instead of across nodes. In DeepSpeed 0.19.8 a released parameter gets its
    secondary partition (``_partition_param_sec``, from the full parameter it held: no communication) and every
    later gather uses it until the optimizer step drops them all (``invalidate_secondary_tensor``): so only the
    first forward after a step gathers over all ranks (across the nodes on several), and every other pass of the
    step (backward, a recomputed forward, the later micro-steps' forwards) gathers over the group (ring
    ``(g-1)/g``, the node's link when the group fits in a node, as the default space offers). The call count does
    not change.
    """
    world = s.zero_ranks
    persistent = sum(n for n in numels if n <= s.param_persistence_threshold) if world > 1 else 0
    one_pass = gathered_bytes_per_element(s) * (psi - persistent)  # int8 under qwZ
    every_pass = s.grad_accum * passes * one_pass
    link = hw.inter_bw if workload.cluster.nodes > 1 else hw.intra_bw
    group = min(s.ranks.hpz, world)  # ZeRO-3's: its gathers' only caller
    if group <= 1:
        return (world - 1) / world * every_pass / link
    group_link = hw.intra_bw if group <= workload.cluster.gpus_per_node else hw.inter_bw
    return (world - 1) / world * one_pass / link + (group - 1) / group * (every_pass - one_pass) / group_link


def long_context_seconds(workload: Workload, s: Settings, hw: Hardware, flops_rate: float) -> tuple[float, float, int]:
    """(compute seconds, all-to-all seconds, all-to-all calls) per optimizer step that Ulysses and ALST add.

    Ulysses: every layer's forward exchanges ``(s/sp)·d·(2·q + 2·kv)·e`` bytes per rank in four all-to-alls (query,
    key, value, output), its backward as much again and a recomputed forward once more, ``(sp-1)/sp`` of it leaving
    the rank, over the intra-node link when the group fits a node; never overlapped (attention waits for it).
    ``TiledMLP`` recomputes each MLP's forward in backward: ``2·`` the MLP weights per token more FLOPs.
    """
    model, sp, accum = workload.model, s.ranks.sequence, s.grad_accum
    if model.is_bare:
        return 0.0, 0.0, 0
    tokens = s.micro_batch * workload.train.seq_len // sp
    compute = accum * 2.0 * mlp_params(model) * tokens / flops_rate if s.tiled_mlp_shards > 1 else 0.0
    if sp == 1:
        return compute, 0.0, 0
    passes = 3 if s.activation_checkpointing else 2
    moved = all_to_all_bytes(model, s.micro_batch, tokens // s.micro_batch, s.param_bytes, sp) * (sp - 1) / sp
    link = hw.intra_bw if sp <= workload.cluster.gpus_per_node else hw.inter_bw
    layers = model.num_layers
    return compute, accum * passes * layers * moved / link, accum * passes * layers * 4


def predict(
    workload: Workload,
    trial: TrialConfig | Mapping[str, Any],
    factors: Mapping[str, float] | None = None,
    device_name: str | None = None,
) -> ThroughputPrediction:
    """Predict step time and tokens/s of training ``workload`` with ``trial`` (a :class:`~tuner.workload.TrialConfig`,
    or a bare ds_config, as for :func:`tuner.estimator.estimate`);
    ``factors`` are fitted constants (:class:`tuner.forecast.ThroughputFit`); ``device_name`` picks the
    GPU in the table when known (else it is guessed from the GPU memory).

    Raises:
        ConfigError: a malformed ds_config (as :func:`tuner.estimator.resolve`).
    """
    return predict_resolved(workload, resolve(workload, trial), factors, device_name)


def predict_resolved(
    workload: Workload,
    s: Settings,
    factors: Mapping[str, float] | None = None,
    device_name: str | None = None,
) -> ThroughputPrediction:
    """:func:`predict` for settings already resolved from a trial config."""
    kind = table_key(workload, device_name)
    terms = step_terms(workload, s, hardware_for(workload, device_name))
    f = dict(factors or {})
    step = terms.step_time(f)
    samples = s.global_batch
    tokens = samples * workload.train.seq_len
    flops_per_token = model_flops_per_token(workload.model, workload.train.seq_len, trainable_params(workload))
    flops = flops_per_token * tokens / s.world_size / step
    peak = peak_tflops(kind) if kind != "cpu" else None
    bound = max(TERMS, key=lambda name: getattr(terms, name) * f.get(name, 1.0))
    return ThroughputPrediction(
        hardware=kind,
        step_time_s=step,
        tokens_per_s=tokens / step,
        samples_per_s=samples / step,
        tflops_per_device=flops / 1e12,
        mfu=flops / 1e12 / peak if peak else None,
        bound=bound,
        terms=terms,
        factors=f,
    )


__all__ = [
    "TERMS",
    "StepTerms",
    "ThroughputPrediction",
    "all_params",
    "long_context_seconds",
    "predict",
    "predict_resolved",
    "step_terms",
    "trainable_params",
    "zero3_gather_seconds",
]
