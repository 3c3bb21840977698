"""AutoTP tensor parallelism (``tensor_parallel.autotp_size`` = tp): one rank's view of the model (its shards) and the
all-reduces it adds.

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
"""

from __future__ import annotations

import functools
from dataclasses import replace

from tuner.estimator.layouts.base import LayoutTerms
from tuner.estimator.settings import Settings
from tuner.estimator.terms import NOTHING, Contribution, detail
from tuner.estimator.throughput.hardware import Hardware
from tuner.workload import ModelSpec, Ranks, Workload
from tuner.workload.layout_checks import tp_plan_split
from tuner.workload.layouts import AUTOTP as AUTOTP_KIND


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


class AutoTPTerms(LayoutTerms):
    """AutoTP in the estimator: the rank holds its shards (:func:`tp_workload`) and all-reduces its layers' outputs
    (:func:`tensor_parallel_seconds`)."""

    kind = AUTOTP_KIND

    def group(self, ranks: Ranks) -> int:
        return ranks.tensor

    def rank_view(self, workload: Workload, s: Settings) -> tuple[Workload, Contribution]:
        return tp_workload(workload, s), tp_details(workload, s)

    def collective_seconds(self, workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
        return tensor_parallel_seconds(workload, s, hw)


AUTOTP = AutoTPTerms()


__all__ = [
    "AUTOTP",
    "linear_sizes",
    "local_numels",
    "shard_mask",
    "sharded",
    "tensor_parallel_seconds",
    "tp_details",
    "tp_workload",
]
