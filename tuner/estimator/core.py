"""The analytic memory estimator: workload + ds_config in, bytes per GPU and per node's CPU out.

The estimate follows DeepSpeed 0.19 as measured (``tests/estimator/test_estimator_deepspeed.py``), not only the ZeRO
paper, and is assembled here from the modules that model each part:

* model states: ZeRO 0-2's flat groups and buckets (:mod:`.flat_states`), ZeRO-3's shards (:mod:`.stage3_states`)
  and the whole parameters it gathers (:mod:`.stage3_gathered`);
* activations and backward's early worst moments (:mod:`.activation_phases`);
* transient buffers inside a phase (:mod:`.transients`);
* AutoTP's shards and hpZ's secondary partition (:mod:`.layouts.autotp`): with ``tensor_parallel.autotp_size`` the
  model states are those of the rank's shards, partitioned by ZeRO over ``world / tp`` ranks; activations are
  tp-sharded inside attention and the MLP (:func:`.activations.tp_local_activations`).
* AutoEP's local experts (:mod:`.layouts.autoep`): with ``expert_parallel.autoep_size`` a rank holds ``experts / ep``
  of each MoE layer, partitioned by ZeRO over the ``world / ep`` expert-data-parallel ranks, and the dispatch and
  combine buffers of its routed tokens.

Peak memory is the maximum over three phases of a step (:mod:`.phases`), each a sum of what is alive then:
``forward`` (after the forward pass: activations plus the logits workspace), ``backward`` (all gradients and the
reduce buckets; one recomputed block when checkpointing) and ``step`` (fp32 gradients). ZeRO-3 with
``stage3_gather_16bit_weights_on_model_save`` adds a fourth, ``save`` (:func:`.save_phase`): saving the model
gathers the whole 16-bit model on rank 0. Overhead on CUDA (named terms: CUDA context, NCCL communicators, cuBLAS
workspaces, the caching allocator's reserve, :mod:`.overhead`) is added on top of the peak; its defaults are
calibrated from measured runs later.

Host buffers DeepSpeed pins cost their size rounded up to a power of two on CUDA hosts (:mod:`.pinned`);
``cpu_per_node["pinned"]`` reports the page-locked bytes, which are part of the node's total, not added to it.

With a peft adapter or frozen parameters (``Workload.trainable``) the model is the model as trained (its profile
counts the peft model's parameters and which train): gradients, fp32 masters, optimizer states, flat groups and
reduce traffic cover the trainable parameters only; frozen weights are replicated in the training dtype at ZeRO 0-2
and partitioned at ZeRO-3, where peft's fp32 adapters stay fp32 (:mod:`.trainable`, measured with
``bench/peft_memory.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from tuner.estimator.activations.activation_phases import activation_terms
from tuner.estimator.layouts import LayoutTerms, active
from tuner.estimator.memory_estimate import MemoryEstimate
from tuner.estimator.phases import CATEGORIES, PHASES, STEP_PHASES, Phase
from tuner.estimator.runtime.overhead import DEFAULT_OVERHEAD, Overhead, overhead_terms
from tuner.estimator.settings import Settings, resolve
from tuner.estimator.states.flat_states import flat_states
from tuner.estimator.states.quantized import dequantized_weight_bytes, estimate_only_why, quantized_base
from tuner.estimator.states.saved_weights import saved_weight_views
from tuner.estimator.states.stage3_gathered import save_phase
from tuner.estimator.states.stage3_states import stage3_states
from tuner.estimator.states.trainable import trained_params
from tuner.estimator.terms import NOTHING, Contribution, Ledger, detail, transient
from tuner.workload import TrialConfig, Workload

HOST_CATEGORIES = ("parameters", "gradients", "optimizer_states", "buffers")  # cpu_per_node's (+ offloaded checkpoints)
_BY_CATEGORY = itemgetter(*CATEGORIES)  # a phase's bytes as a tuple, in CATEGORIES' order
_NOTHING_HELD = dict.fromkeys(CATEGORIES, 0)


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
    model, cluster, whole = workload.model, workload.cluster, workload
    ledger = Ledger(PHASES if s.stage == 3 and s.gather_16bit_on_save else STEP_PHASES)
    layouts = active(s.ranks)  # the layouts the trial turns on (tuner.estimator.layouts.LAYOUTS)
    workload, view = _rank_view(whole, s, layouts)
    ledger.record(view)
    params = trained_params(workload)
    nvme, states = (stage3_states if s.stage == 3 else flat_states)(workload, s, params)
    ledger.record(states)
    gathered = 0
    if "save" in ledger.phases:  # saving gathers over tp too
        gathered, saved = save_phase(whole, s)
        ledger.record(saved)
    for layout in layouts:  # hpZ's secondary partition
        ledger.record(layout.state_terms(params.numels, s, ledger.details))
    if not params.is_full:
        ledger.record(detail("trainable_elements", params.n_trainable) + detail("frozen_elements", params.n_frozen))
    base = quantized_base(workload, params)
    if base is not None:  # backward dequantizes each 4-bit weight whole, one at a time
        ledger.record(transient("dequantized_weight", "backward", dequantized_weight_bytes(base, s.param_bytes)))
    source, activations = activation_terms(workload, s, params, ledger.details, ledger.phases)
    ledger.record(activations + saved_weight_views(workload, s, ledger.details))  # ZeRO-3 with torch's F.linear
    for layout in layouts:  # AutoEP's all-to-all buffers
        ledger.record(layout.buffer_terms(workload, s))

    phases, details = ledger.phases, ledger.details
    gpu_totals = {name: sum(phase.gpu.values()) for name, phase in phases.items()}
    peak_phase = max(gpu_totals, key=gpu_totals.__getitem__)
    per_gpu: dict[str, int | None] = dict(phases[peak_phase].gpu)
    if source is None:
        per_gpu["activations"] = None
    terms, figures = overhead_terms(workload, s, overhead, phases, details, gpu_totals[peak_phase])
    ledger.record(figures)
    device_overhead = sum(terms.values())
    per_gpu["overhead"] = device_overhead
    per_gpu["total"] = gpu_totals[peak_phase] + device_overhead
    cpu_per_node = _cpu_per_node(workload, overhead, phases, ledger.pinned, gathered)
    if ledger.pinned:
        ledger.record(detail("pinned_host", ledger.pinned) + detail("pinned_rounding", ledger.rounding))
    return MemoryEstimate(
        n_params=whole.model.n_params if workload is not whole else params.n_params,  # the whole model's, not a rank's
        world_size=s.world_size,
        phases=phases,
        peak_phase=peak_phase,
        per_gpu=per_gpu,
        cpu_per_node=cpu_per_node,
        nvme_per_node=nvme * cluster.gpus_per_node,
        gpu_memory=cluster.gpu_memory,
        cpu_memory=cluster.cpu_memory,
        details=details,
        activations_known=source is not None,
        architecture=model.architecture or model.family,
        activations_source=source or "none",
        overhead_terms=terms,
        trainable_params=None if params.is_full else params.n_trainable,
        estimate_only=estimate_only_why(
            workload, s.quantized_nontrainable, s.stage == 3 and (s.quantized_weights or s.quantized_gradients)
        ),
    )


def _rank_view(workload: Workload, s: Settings, layouts: tuple[LayoutTerms, ...]) -> tuple[Workload, Contribution]:
    """The workload as one rank holds it under the trial's ``layouts`` (AutoTP's shards, AutoEP's local experts),
    and the figures of each view."""
    figures = NOTHING
    for layout in layouts:
        workload, view = layout.rank_view(workload, s)
        figures += view
    return workload, figures


def _cpu_per_node(
    workload: Workload, overhead: Overhead, phases: Mapping[str, Phase], pinned: int, gathered: int
) -> dict[str, int]:
    """The worst node's host bytes: its ranks' host categories at their peak (:func:`_node_host`), their processes,
    the total, and the page-locked part of it (``pinned``)."""
    cluster = workload.cluster
    process = overhead.cpu_process_cuda if cluster.device == "cuda" else overhead.cpu_process_cpu
    ranks = cluster.gpus_per_node
    cpu_per_node, node_peak = _node_host(phases, ranks, gathered)
    cpu_per_node["processes"] = ranks * process
    # Building the model adds no host bytes: measured runs build it where it trains (tuner.measure.rank.birth). ZeRO-3
    # builds under deepspeed.zero.Init (each module's parameters created on the rank's device in the training dtype,
    # partitioned as soon as the module exists: the device briefly holds one module whole, the host nothing; with
    # offload_param the shards land in host memory the parameter phases already count), stages 0-2 directly on the
    # device in the training dtype. No rank holds the full fp32 copy on the host that used to cost 4·Ψ bytes per
    # rank (280 GB for a 70B model). Measured on CPU ranks: the resident set grows by e·Ψ/N while building
    # (tests/measure/test_birth.py).
    cpu_per_node["model_load"] = 0
    cpu_per_node["total"] = node_peak + cpu_per_node["processes"] + cpu_per_node["model_load"]
    cpu_per_node["pinned"] = ranks * pinned
    return cpu_per_node


def _node_host(phases: Mapping[str, Phase], ranks: int, gathered: int) -> tuple[dict[str, int], int]:
    """The worst node's host bytes: the largest of each category over the phases, and the peak of their sums.

    Every rank holds its phase's host bytes, except that in the ``save`` phase only rank 0 holds the ``gathered``
    model.
    """
    held = [_BY_CATEGORY(phase.cpu) for name, phase in phases.items() if name != "save"]
    peak = ranks * max(map(sum, held))
    largest = _NOTHING_HELD  # nothing on the host (nothing offloaded): the common case, no look at each category
    if peak:
        largest = dict(zip(CATEGORIES, map(max, zip(*held, strict=True)), strict=True))
    by_category = {name: ranks * largest[name] for name in HOST_CATEGORIES}
    if largest["activations"]:  # checkpoints offloaded to host memory (ALST)
        by_category["activations"] = ranks * largest["activations"]
    if "save" in phases:
        save = phases["save"].cpu
        for name in HOST_CATEGORIES:
            size = ranks * save[name] - ((ranks - 1) * gathered if name == "parameters" else 0)
            by_category[name] = max(by_category[name], size)
        peak = max(peak, ranks * sum(save.values()) - (ranks - 1) * gathered)
    return by_category, peak
