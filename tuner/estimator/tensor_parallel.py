"""AutoTP tensor parallelism (``tensor_parallel.autotp_size`` = tp) in the model states of one rank, and ZeRO++ hpZ's
secondary partition.

What AutoTP shards (DeepSpeed 0.19.8, ``runtime/engine.py`` ``_apply_autotp_partitioning``, ``module_inject/
auto_tp.py`` and ``layers.py``; a transformers model's ``tp_plan`` when it has one, the same heuristic otherwise):
the attention's q, k, v (column-parallel, by heads) and output projection (row-parallel), the MLP's up and gate
(column) and down projection (row), and an untied LM head (column-parallel with its output gathered). The
embeddings, the norms, the biases of the row-parallel Linears and a tied LM head (``colwise_gather_output`` on a
weight tied to the embedding: "leaving these modules replicated to preserve tied weights") stay whole on every
rank. ZeRO then partitions each rank's parameters over the data-parallel group, ``world / tp`` ranks
(:attr:`.Settings.zero_ranks`), except that ZeRO-3 partitions the parameters AutoTP leaves whole over all ranks
(:mod:`.stage3_states`; measured). The rank's view of the model (:func:`tp_workload`) says which those are
(``ModelSpec.replicated``).

Which parameters AutoTP shards is the model's profile's (``ModelProfile.tp_sharded``, read from the built model's
``tp_plan`` as DeepSpeed reads it, :mod:`tuner.profile.tp_plan`: column-parallel weights with their biases,
row-parallel weights without); the rank's parameters then equal DeepSpeed's for the tiny LLaMA, the wide one and a
biased LayerNorm model (Phi), measured. Without a profile (a built-in model) it is read from the shapes
(:func:`shard_mask`): the weights whose element count is one of a layer's Linear shapes (``h × q``, ``h × kv``,
``h × f``, a fused ``h × (q + 2·kv)``) and that recur once per layer, plus an untied head (the last parameter,
``V × h``), biases whole. A rank's shard of each is ``ceil(n / tp)`` elements.

hpZ (``zero_hpz_partition_size`` = g, ZeRO-3): ``_partition_param_sec`` gives a parameter a secondary partition
over its hpZ group when it is released (partitioned) after use, ``aligned numel / g`` elements in the parameter's
dtype; backward gathers from it inside the group, and the optimizer step drops them all
(``invalidate_secondary_tensor``). Up to ``e·Ψ/g`` per rank beside the primary shard, by phase
(:func:`hpz_secondary_bytes`): measured on 4 CPU ranks with hpZ = 2 (``bench/tp_true_peak.py``), a tiny model whose
parameters ZeRO-3 keeps gathered from forward into backward peaks with no secondary partition alive, to the byte.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from tuner.estimator.settings import Settings
from tuner.estimator.states.partitions import stage3_layout
from tuner.estimator.terms import NOTHING, Contribution, Held, detail
from tuner.estimator.throughput.hardware import Hardware
from tuner.workload import ModelSpec, Workload
from tuner.workload.layout_checks import tp_plan_split


def linear_sizes(model: ModelSpec) -> frozenset[int]:
    """Element counts of the Linear weights AutoTP shards in one layer (q, k, v, o, fused qkv, MLP; an MLP width the
    config leaves unset is GPT-2's 4h).

    >>> from tuner.workload import load_builtin_model
    >>> sorted(linear_sizes(load_builtin_model("llama-2-7b")))
    [16777216, 45088768, 50331648]
    """
    h = model.hidden_size
    head_dim = model.head_dim or h // max(1, model.num_heads)
    q, kv = model.num_heads * head_dim, (model.num_kv_heads or model.num_heads) * head_dim
    f = model.intermediate_size or 4 * h  # unset in GPT-2's config (n_inner None): 4h
    return frozenset(size for size in (h * q, h * kv, h * f, h * (q + 2 * kv)) if size)


@functools.lru_cache(maxsize=64)  # a pure function of a frozen model; a recommender's grid asks it per config
def shard_mask(model: ModelSpec) -> tuple[bool, ...]:
    """Which of ``model.param_numels`` AutoTP shards (module docstring): per Linear size, its last ``k × L``
    occurrences for the largest ``k`` that fits (an embedding that happens to have a Linear's size is not one of
    them), and an untied LM head."""
    numels, sizes = model.param_numels, linear_sizes(model)
    head = len(numels) - 1 if not model.tie_embeddings and numels[-1] == model.vocab_size * model.hidden_size else -1
    layers = max(1, model.num_layers)
    where: dict[int, list[int]] = {}
    for index, numel in enumerate(numels):
        if numel in sizes and index != head:
            where.setdefault(numel, []).append(index)
    mask = [False] * len(numels)
    for indices in where.values():
        for index in indices[len(indices) - len(indices) // layers * layers :]:
            mask[index] = True
    if head >= 0:
        mask[head] = True
    return tuple(mask)


def sharded(workload: Workload) -> tuple[bool, ...]:
    """Which of the model's parameters AutoTP shards: the profile's split (read from the model's ``tp_plan``,
    :func:`tuner.workload.layout_checks.tp_plan_split`) where it has one, else :func:`shard_mask`'s."""
    return tp_plan_split(workload) or shard_mask(workload.model)


@functools.lru_cache(maxsize=256)
def local_numels(numels: tuple[int, ...], mask: tuple[bool, ...], tp: int) -> tuple[int, ...]:
    """Each parameter's elements on one tensor-parallel rank: ``ceil(n / tp)`` for the sharded ones (``mask``)."""
    return tuple(-(-n // tp) if on else n for n, on in zip(numels, mask, strict=True))


def tp_workload(workload: Workload, s: Settings) -> Workload:
    """The workload as one tensor-parallel rank holds it: its model's parameters are the rank's shards (the shapes
    the activations are computed from stay the model's). ``workload`` itself without AutoTP."""
    tp = s.layout.tensor_parallel
    if tp <= 1:
        return workload
    model, mask = workload.model, sharded(workload)
    local = local_numels(model.param_numels, mask, tp)
    return replace(workload, model=replace(model, numels=local, replicated=tuple(not on for on in mask)))


def tp_details(workload: Workload, s: Settings) -> Contribution:
    """The figures of one tensor-parallel rank's view (:func:`tp_workload` of ``workload``): the elements AutoTP
    shards and the rank's own; nothing without AutoTP."""
    tp = s.layout.tensor_parallel
    if tp <= 1:
        return NOTHING
    model, mask = workload.model, sharded(workload)
    return (
        *detail("tp_sharded_elements", sum(n for n, on in zip(model.param_numels, mask, strict=True) if on)),
        *detail("tp_local_elements", sum(local_numels(model.param_numels, mask, tp))),
    )


def hpz_secondary_bytes(numels: tuple[int, ...], s: Settings, kept: int = 0) -> dict[str, int]:
    """Bytes of hpZ's secondary partition on one rank, by phase (module docstring): each partitioned parameter's
    ZeRO-aligned size over the hpZ group, in the training dtype, for the parameters released since the last step
    (the step drops them all: ``invalidate_secondary_tensor``; a release re-creates one). After backward and in the
    step every non-persistent parameter has been released; after forward all but the ``kept`` elements ZeRO-3 keeps
    gathered for backward. Empty without hpZ or outside ZeRO-3.

    >>> from tuner.estimator.settings import Settings
    >>> from tuner.workload import ParallelLayout, Ranks
    >>> fields = dict(world_size=4, micro_batch=1, grad_accum=1, global_batch=4, precision="bf16", stage=3,
    ...     overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=1, allgather_bucket_size=1,
    ...     offload_optimizer="none", offload_optimizer_pin=False, offload_optimizer_buffer_count=4,
    ...     offload_param="none", offload_param_pin=False, offload_param_buffer_count=5, offload_param_buffer_size=1,
    ...     max_live_parameters=1, max_reuse_distance=1, prefetch_bucket_size=1, param_persistence_threshold=0,
    ...     model_persistence_threshold=0, sub_group_size=1, ranks=Ranks(4, hpz=2),
    ...     layout=ParallelLayout(hpz_partition_size=2))
    >>> hpz_secondary_bytes((1000, 6), Settings(**fields), kept=1000)  # (1000 + 8) / 2 × 2 B
    {'forward': 8, 'backward': 1008, 'step': 1008}
    """
    group = s.layout.hpz_partition_size
    if s.stage != 3 or group <= 1:
        return {}
    ranks = s.zero_ranks  # AutoTP's replicated parameters counted as the sharded ones: unmeasured
    parts, persists = stage3_layout(numels, ranks, s.param_persistence_threshold, s.model_persistence_threshold)
    full = s.param_bytes * sum(part for part, keep in zip(parts, persists, strict=True) if not keep) * ranks // group
    return {"forward": max(0, full - s.param_bytes * kept // group), "backward": full, "step": full}


def hpz_secondary(numels: tuple[int, ...], s: Settings, kept: int, offloaded: bool) -> Contribution:
    """hpZ's secondary partition (:func:`hpz_secondary_bytes`) as the parameters it holds by phase, on the host when
    the parameters are ``offloaded`` (``offload_param``); the figure recorded is the step's (every parameter
    released)."""
    by_phase = hpz_secondary_bytes(numels, s, kept)
    if not by_phase:
        return NOTHING
    where = "cpu" if offloaded else "gpu"
    sizes = (Held(where, "parameters", size, (phase,)) for phase, size in by_phase.items())
    return (*detail("hpz_secondary_partition", by_phase["step"]), *sizes)


def tensor_parallel_seconds(workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
    """(all-reduce seconds, calls) per optimizer step that AutoTP adds: each layer all-reduces its attention's and
    its MLP's row-parallel output (``e·b·s·h``) in forward, the column-parallel inputs' gradients in backward, and
    again in a recomputed forward; ring all-reduces, ``2·(tp-1)/tp`` of the bytes, within a node; never overlapped
    (the next Linear waits for them)."""
    tp, model = s.layout.tensor_parallel, workload.model
    if tp <= 1 or model.is_bare:
        return 0.0, 0
    calls = s.grad_accum * (3 if s.activation_checkpointing else 2) * 2 * model.num_layers
    size = s.param_bytes * s.micro_batch * workload.train.seq_len * model.hidden_size
    return calls * size * 2 * (tp - 1) / tp / hw.intra_bw, calls


__all__ = [
    "hpz_secondary",
    "hpz_secondary_bytes",
    "linear_sizes",
    "local_numels",
    "shard_mask",
    "sharded",
    "tensor_parallel_seconds",
    "tp_details",
    "tp_workload",
]
