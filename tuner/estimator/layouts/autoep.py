"""AutoEP expert parallelism (``expert_parallel.autoep_size`` = ep) in the model states of one rank, its dispatch and
combine buffers, and its all-to-all time.

What AutoEP holds (DeepSpeed 0.19.8, ``module_inject/auto_ep_layer.py`` ``AutoEPMoELayer.__init__``): each MoE
block is replaced by a layer whose ``GroupedExperts`` hold the rank's ``experts / ep`` routed experts as three 3-D
weights ``w1``, ``w2``, ``w3`` of ``E/ep × f × h`` elements each (transformers 5's fused ``gate_up_proj``,
``E × 2f × h``, and ``down_proj``, ``E × h × f``, split and sliced by ``repack_expert_weights``). Router and shared
experts stay whole on every rank. The expert weights are marked ``allreduce = False`` with the expert group's name
(``auto_ep_layer.py:673``), which is what ZeRO keys on:

* ZeRO-1/2: the engine splits the optimizer's parameters into a dense group and expert groups
  (``runtime/engine.py:2331`` ``configure_moe_param_groups``, ``moe/utils.py``
  ``split_params_into_different_moe_groups_for_optimizer``: expert groups cut at 178,956,971 elements), and the
  optimizer partitions each expert group over the expert-data-parallel group, ``world / ep`` ranks
  (``runtime/zero/stage_1_and_2.py:880`` ``_configure_moe_settings``), the dense one over the data-parallel ranks.
* ZeRO-3: the expert weights are partitioned over the expert-data-parallel group (``runtime/engine.py:922``
  ``_partition_autoep_zero3_experts``, ``:2242`` ``_resolve_zero3_param_placement``), the rest over all ranks.

Which parameters are experts is read from the model's shapes (:func:`expert_mask`): the weights whose element count
is ``E × 2f × h`` or ``E × f × h`` (E routed experts, f the expert width, h the hidden size of the transformers
config). The rank's view of the model (:func:`ep_workload`) has them replaced by its ``w1, w2, w3`` and marked
(``ModelSpec.experts``); :func:`ep_flat_partition` and the ZeRO-3 layout partition them over ``world / ep``.

Dispatch and combine (``auto_ep_layer.py`` ``_forward``, ``_AllToAll``): each token goes to its ``top_k`` experts;
the rank permutes its ``t·k`` rows (t = b·s tokens), sends them with ``all_to_all_single`` into a received buffer of
the same size on average, runs its local experts on them and sends the outputs back the same way: per MoE layer
``e·t·k·h`` bytes each way, forward and again in backward (:func:`expert_parallel_seconds`).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from tuner.estimator.layouts.base import LayoutTerms
from tuner.estimator.settings import Settings
from tuner.estimator.states.partitions import FlatPartition, flat_partition
from tuner.estimator.terms import NOTHING, Contribution, detail, transient
from tuner.estimator.throughput.hardware import Hardware
from tuner.workload import ModelSpec, Ranks, Workload
from tuner.workload.layouts import AUTOEP as AUTOEP_KIND

MOE_GROUP_ELEMENTS = 178_956_971  # split_params_into_different_moe_groups_for_optimizer's max_group_size


def moe_shapes(model: ModelSpec) -> tuple[int, int, int]:
    """(routed experts E, expert width f, experts per token k) of a transformers MoE config; zeros if dense.

    >>> moe_shapes(ModelSpec("m", "mixtral", hidden_size=64,
    ...     hf_config='{"num_local_experts": 4, "intermediate_size": 48, "num_experts_per_tok": 2}'))
    (4, 48, 2)
    """
    config, experts = model.text_config, model.routed_experts
    width = config.get("moe_intermediate_size") or config.get("intermediate_size") or 0
    return experts, int(width) if experts else 0, int(config.get("num_experts_per_tok") or 0) if experts else 0


def expert_sizes(model: ModelSpec) -> tuple[int, int]:
    """Element counts of transformers 5's fused expert weights: ``gate_up_proj`` (E·2f·h) and ``down_proj`` (E·f·h)."""
    experts, width, _ = moe_shapes(model)
    return 2 * experts * width * model.hidden_size, experts * width * model.hidden_size


@functools.lru_cache(maxsize=64)
def expert_mask(model: ModelSpec) -> tuple[bool, ...]:
    """Which of ``model.param_numels`` are routed-expert weights (module docstring)."""
    sizes = set(expert_sizes(model)) - {0}
    return tuple(numel in sizes for numel in model.param_numels)


@functools.lru_cache(maxsize=64)
def local_layout(model: ModelSpec, ep: int) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """The parameters one AutoEP rank holds and which are experts: each fused ``gate_up_proj`` becomes ``w1`` and
    ``w3``, each ``down_proj`` ``w2``, of ``E/ep × f × h`` elements each; everything else as it was."""
    gate_up, down = expert_sizes(model)
    local = gate_up // 2 // ep
    numels: list[int] = []
    experts: list[bool] = []
    for numel, expert in zip(model.param_numels, expert_mask(model), strict=True):
        if not expert:
            numels.append(numel)
            experts.append(False)
            continue
        pieces = 2 if numel == gate_up and gate_up != down else 1
        numels += [local] * pieces
        experts += [True] * pieces
    return tuple(numels), tuple(experts)


def ep_workload(workload: Workload, s: Settings) -> Workload:
    """The workload as one expert-parallel rank holds it (module docstring); ``workload`` itself without AutoEP."""
    ep = s.layout.expert_parallel
    if ep <= 1:
        return workload
    numels, experts = local_layout(workload.model, ep)
    return replace(workload, model=replace(workload.model, numels=numels, experts=experts))


def ep_details(workload: Workload, s: Settings) -> Contribution:
    """The figures of one expert-parallel rank's view (:func:`ep_workload` of ``workload``): its local experts per MoE
    layer, its expert elements and all its elements; nothing without AutoEP."""
    ep = s.layout.expert_parallel
    if ep <= 1:
        return NOTHING
    numels, experts = local_layout(workload.model, ep)
    return (
        *detail("ep_local_experts", workload.model.routed_experts // ep),
        *detail("ep_expert_elements", sum(n for n, on in zip(numels, experts, strict=True) if on)),
        *detail("ep_local_elements", sum(numels)),
    )


def ep_flat_partition(numels: tuple[int, ...], experts: tuple[bool, ...], s: Settings) -> FlatPartition:
    """ZeRO-1/2's flat buffers of one rank: the dense group over :attr:`.Settings.zero_ranks` and each expert group
    (cut at :data:`MOE_GROUP_ELEMENTS`) over the expert-data-parallel group (world / ep), summed; without experts
    the one flat group.
    The worst rank's gradients add the worst rank of each group (an upper bound when they are different ranks)."""
    if not any(experts):
        return flat_partition(numels, s.zero_ranks)
    dense = tuple(n for n, on in zip(numels, experts, strict=True) if not on)
    groups: list[list[int]] = [[]]
    for numel, on in zip(numels, experts, strict=True):
        if not on:
            continue
        if groups[-1] and sum(groups[-1]) + numel > MOE_GROUP_ELEMENTS:
            groups.append([])
        groups[-1].append(numel)
    parts = [flat_partition(dense, s.zero_ranks)] if dense else []
    parts += [flat_partition(tuple(group), s.ranks.expert_data_parallel) for group in groups if group]
    return FlatPartition(
        sum(p.padded_total for p in parts),
        sum(p.partition for p in parts),
        sum(p.worst_rank_grads for p in parts),
        tuple(p.partition for p in parts),
    )


def dispatch_bytes(workload: Workload, s: Settings) -> int:
    """Bytes of one MoE layer's dispatch or combine buffer on a rank: its ``t·k`` routed rows of ``h`` elements."""
    _, _, top_k = moe_shapes(workload.model)
    tokens = s.micro_batch * workload.train.seq_len
    return s.param_bytes * tokens * top_k * workload.model.hidden_size


def dispatch_terms(workload: Workload, s: Settings) -> Contribution:
    """AutoEP's all-to-all buffers in the phases (module docstring). Forward saves what transformers' own MoE block
    saves (the traced profile; measured: the true peak with AutoEP 2 is within 0.5 % of the estimate from the
    transformers block's saved bytes, ``bench/results/ep_true_peak.md``): the rows sent are freed once received, and
    the received rows become the experts' input, which the block saves anyway. In backward each MoE layer holds the
    gradient rows it sends and those it receives at once: ``2·e·t·k·h`` at its worst moment."""
    if s.layout.expert_parallel <= 1 or workload.model.is_bare:
        return NOTHING
    rows = dispatch_bytes(workload, s)
    return detail("ep_dispatch_bytes", rows) + transient("ep_all_to_all", "backward", 2 * rows)


def moe_layers(model: ModelSpec) -> int:
    """MoE layers: the fused ``down_proj`` weights in the model (in a rank's view, its ``w1, w2, w3`` triples)."""
    if model.experts:
        return sum(model.experts) // 3
    down = expert_sizes(model)[1]
    return sum(1 for numel in model.param_numels if numel == down) if down else 0


def expert_parallel_seconds(workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
    """(all-to-all seconds, calls) per optimizer step that AutoEP adds: per MoE layer a dispatch and a combine in
    forward and both again in backward (and in a recomputed forward), each :func:`dispatch_bytes` of which
    ``(ep-1)/ep`` leave the rank; not overlapped (the experts wait for their tokens). Within a node when the ep ranks
    are on one node (consecutive ranks), else over the network."""
    ep, model = s.layout.expert_parallel, workload.model
    if ep <= 1 or model.is_bare:
        return 0.0, 0
    calls = s.grad_accum * (3 if s.activation_checkpointing else 2) * 2 * moe_layers(model)
    bandwidth = hw.intra_bw if ep <= workload.cluster.gpus_per_node else hw.inter_bw
    return calls * dispatch_bytes(workload, s) * (ep - 1) / ep / bandwidth, calls


class AutoEPTerms(LayoutTerms):
    """AutoEP in the estimator: the rank holds its local experts (:func:`ep_workload`) and the dispatch and combine
    buffers of its routed tokens (:func:`dispatch_terms`) and their all-to-alls (:func:`expert_parallel_seconds`)."""

    kind = AUTOEP_KIND

    def group(self, ranks: Ranks) -> int:
        return ranks.expert

    def rank_view(self, workload: Workload, s: Settings) -> tuple[Workload, Contribution]:
        return ep_workload(workload, s), ep_details(workload, s)

    def buffer_terms(self, workload: Workload, s: Settings) -> Contribution:
        return dispatch_terms(workload, s)

    def collective_seconds(self, workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
        return expert_parallel_seconds(workload, s, hw)


AUTOEP = AutoEPTerms()


__all__ = [
    "AUTOEP",
    "MOE_GROUP_ELEMENTS",
    "dispatch_bytes",
    "dispatch_terms",
    "ep_details",
    "ep_flat_partition",
    "ep_workload",
    "expert_mask",
    "expert_parallel_seconds",
    "expert_sizes",
    "local_layout",
    "moe_layers",
    "moe_shapes",
]
