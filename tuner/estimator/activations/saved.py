"""Bytes autograd keeps for backward (activations) for one micro-batch on one rank.

The ZeRO/Megatron papers give ``s·b·h·(34 + 5·a·s/h)`` per layer in 16-bit. What a model really saves depends on
its kernels, so the coefficients here were measured on the built-in models (``tuner/models.py``) with
``torch.autograd.graph.saved_tensors_hooks`` over many shapes (``tests/test_activations.py`` re-measures them):

* GPT-2 style block (LayerNorm, fused QKV, GELU MLP): ``e·(8·bsh + 2·bsf + 4·bs) + 4·bas`` bytes, where ``e`` is
  the element size, ``f`` the MLP width and ``4·bas`` SDPA's fp32 log-sum-exp. The paper's ``34·bsh`` for
  ``f = 4h`` in 16-bit is the same ``2·(8 + 8)·bsh`` plus dropout masks, which the built-in models do not use.
* LLaMA style block (RMSNorm, rotary, SwiGLU, grouped-query heads expanded before attention):
  ``(6e + 16)·bsh + 4e·bsf + 6·bs + 4·bas``: PyTorch's RMSNorm keeps two fp32 copies of its input.
* Eager attention adds the softmax output ``e·b·a·s²`` and a boolean mask ``s²`` per layer, instead of the
  log-sum-exp. Flash/SDPA attention keeps no score matrix.
* Full activation checkpointing (per block) keeps only each block's input, ``e·bsh`` per layer.
* Outside the blocks: the final norm and LM-head input (``2e·bsh`` with LayerNorm, ``(e + 8)·bsh`` with RMSNorm),
  the fp32 log-softmax of the logits ``4·bsV`` (logits are upcast to fp32 for the loss, as transformers does), and
  token ids, targets and loss statistics (``28·bs``).

Under AutoTP (tp ranks) each rank saves, per layer, the whole of what the norms and the Linears' inputs keep
(:func:`tp_whole_layer_bytes`) and ``1/tp`` of the rest (attention over ``heads/tp``, the MLP's ``f/tp`` intermediates);
outside the blocks everything stays whole (embeddings, final norm, the logits of a replicated or gathered head). The
whole part of a transformers LLaMA layer was measured by tracing the model with ``heads/tp``, ``kv/tp`` and ``f/tp``
(head dim kept; bf16, sdpa, two shapes): exactly ``(8 + 4e)·bsh + 8·bs``, the two RMSNorms' fp32 input and
normalized copies, their outputs and ``rsqrt``; the per-rank total at tp = 2 was 0.76 of one rank's (0.756 measured
under real AutoTP on 2 CPU ranks).

These formulas describe dstune's built-in models only. A model trained through transformers saves what its own code
saves (tiny GPT-2: 37 % more than the formula), so its activations come from the workload's traced profile
(:mod:`tuner.profile`); without one, the formula stands in for the five built-in families and the activations of
other models are unknown.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.estimator.memo import per_workload
from tuner.workload import SUPPORTED_FAMILIES, ActivationProfile, ModelSpec, Workload

TOKEN_BYTES = 28  # token ids + targets (int64) and per-token loss statistics


def layer_activation_bytes(model: ModelSpec, batch: int, seq: int, elem: int, attention: str) -> int:
    """Saved bytes of one transformer block without recomputation."""
    bs = batch * seq
    bsh = bs * model.hidden_size
    bsf = bs * model.intermediate_size
    if model.norm == "rmsnorm":
        per_layer = (6 * elem + 16) * bsh + 4 * elem * bsf + 6 * bs
    else:
        per_layer = elem * (8 * bsh + 2 * bsf + 4 * bs)
        if not model.learned_positions:  # rotary on a GPT-NeoX style block: rotated q and k copies
            per_layer += 2 * elem * bsh
    if attention == "eager":
        per_layer += elem * batch * model.num_heads * seq * seq + seq * seq
    else:
        per_layer += 4 * batch * model.num_heads * seq
    return per_layer


def head_activation_bytes(model: ModelSpec, batch: int, seq: int, elem: int) -> int:
    """Saved bytes outside the blocks: final norm, LM head input, fp32 log-softmax, tokens."""
    bs = batch * seq
    norm_and_head = (2 * elem if model.norm == "layernorm" else elem + 8) * bs * model.hidden_size
    return norm_and_head + 4 * bs * model.vocab_size + TOKEN_BYTES * bs


def tp_whole_layer_bytes(model: ModelSpec, batch: int, seq: int, elem: int, traced: bool) -> int:
    """Bytes of one layer's saved activations AutoTP leaves whole on every rank (module docstring): the norms'
    saved tensors and the column-parallel Linears' input. RMSNorm: ``(8 + 4e)·bsh + 8·bs`` in transformers' LLaMA
    (measured; ``traced``), ``(16 + 2e)·bsh + 6·bs`` in the built-in formula; LayerNorm: inputs, outputs and
    statistics of both norms, ``4e·(bsh + bs)`` (from the formula; unmeasured under AutoTP).

    >>> from tuner.workload import load_builtin_model
    >>> tp_whole_layer_bytes(load_builtin_model("llama-2-7b"), 1, 2, 2, traced=True)  # (8 + 8) × 2 × 4096 + 16
    131088
    """
    bs = batch * seq
    bsh = bs * model.hidden_size
    if model.norm == "layernorm":
        return 4 * elem * (bsh + bs)
    return (8 + 4 * elem) * bsh + 8 * bs if traced else (16 + 2 * elem) * bsh + 6 * bs


def tp_local_activations(
    saved: int, recompute: int, layers: int, whole: int, n_layers: int, checkpointing: bool, tp: int
) -> tuple[int, int]:
    """(saved, recomputed block) bytes on one of ``tp`` AutoTP ranks, from one rank's ``saved`` and ``recompute``,
    of which ``layers`` are the decoder layers' (without checkpointing), each keeping ``whole`` bytes unsharded.
    Checkpointed layer inputs and everything outside the layers stay whole.

    >>> tp_local_activations(1000, 0, 800, 100, 2, False, 2)  # 600 sharded bytes halved
    (700, 0)
    """
    if tp <= 1:
        return saved, recompute
    if checkpointing:
        sharded = max(0, recompute - whole)
        return saved, recompute - sharded + -(-sharded // tp)
    sharded = max(0, layers - n_layers * whole)
    return saved - sharded + -(-sharded // tp), recompute


def activation_bytes(
    model: ModelSpec, batch: int, seq: int, elem: int, attention: str, checkpointing: bool
) -> tuple[int, int]:
    """(saved bytes after the forward pass, extra bytes while one block is recomputed in backward)."""
    layer = layer_activation_bytes(model, batch, seq, elem, attention)
    head = head_activation_bytes(model, batch, seq, elem)
    if checkpointing:
        return model.num_layers * elem * batch * seq * model.hidden_size + head, layer
    return model.num_layers * layer + head, 0


def logits_workspace_bytes(model: ModelSpec, batch: int, seq: int, elem: int) -> int:
    """Transient bytes around the loss, beside the saved fp32 log-softmax: the larger of forward's 16-bit (or fp32)
    logits with their fp32 copy (``(e + 4)·bsV``) and the loss's backward, where the gradients of the log-softmax's
    output and input are both fp32 (``8·bsV``): ``8·bsV`` whatever the dtype.

    The backward moment was measured under Ulysses (``bench/sp_true_peak.py``: at s/sp = 512, V = 4096 the true peak
    falls at the start of backward, 16 MiB above the saved activations and model states).
    """
    return max(elem + 4, 2 * 4) * batch * seq * model.vocab_size


class LayerActivations(NamedTuple):
    """One rank's activations: saved after forward, the extra bytes while one block recomputes (its saved tensors),
    where they come from (``trace`` or ``formula``), traced with checkpointing the recomputed block's worst moments
    in its backward (all of it; outside its MLP, the MLP's tensors left out), the forward pass's worst moment
    before the first layer and what it holds into the layers (masks the model builds), and a layer's backward
    beyond its saved tensors; 0 where unknown."""

    saved: int
    recompute: int
    source: str
    peak: int = 0
    peak_outside_mlp: int = 0
    pre_layer_peak: int = 0
    pre_layer_held: int = 0
    excess: int = 0  # a layer's backward beyond its saved tensors (all of it; outside its MLP)
    excess_outside_mlp: int = 0
    outside: int = 0  # of ``saved``, what the embeddings, final norm, LM head and loss save
    mlp_saved: int = 0  # what one layer's MLP block saves (what a tiled MLP drops; traced)


@per_workload
def workload_activation_bytes(
    workload: Workload,
    micro_batch: int,
    precision: str,
    elem: int,
    checkpointing: bool,
    adapters: str = "",
    sp: int = 1,
    tp: int = 1,
) -> LayerActivations | None:
    """(saved bytes after forward, extra bytes while one block recomputes, source) for ``workload`` at
    ``micro_batch``, with or without activation ``checkpointing``; source ``trace`` (the profile) or ``formula``;
    None when unknown. ``adapters``: the dtype a peft model's adapters run in (``fp32`` under ZeRO-3; the trace with
    them cast when it was not traced). ``sp``: Ulysses' degree, each rank holding ``s/sp`` tokens:
    the profile traced at ``s/sp`` if it has one, else the one at ``s`` scaled by ``1/sp`` (without eager attention,
    which Ulysses refuses, every saved tensor is proportional to the tokens: measured linear in the sequence).
    ``tp``: AutoTP's degree (:func:`tp_local_activations`)."""
    model, train = workload.model, workload.train
    if model.is_bare:
        return None
    seq, n_layers = train.seq_len // sp, model.num_layers
    profile = workload.profile
    if profile is not None and model.implementation == "transformers":
        for traced, scale in ((seq, 1), (train.seq_len, sp)):
            for kind in (adapters, "") if adapters else (adapters,):
                entry = profile.activation(traced, precision, train.attention, checkpointing, kind)
                if entry is not None:
                    return _from_trace(workload, entry, (micro_batch, seq, scale), elem, checkpointing, tp)
    if model.implementation == "builtin" or model.family in SUPPORTED_FAMILIES:
        saved, recompute = activation_bytes(model, micro_batch, seq, elem, train.attention, checkpointing)
        if tp > 1:
            layers = n_layers * layer_activation_bytes(model, micro_batch, seq, elem, train.attention)
            whole = tp_whole_layer_bytes(model, micro_batch, seq, elem, traced=False)
            saved, recompute = tp_local_activations(saved, recompute, layers, whole, n_layers, checkpointing, tp)
        return LayerActivations(saved, recompute, "formula")
    return None


def _from_trace(
    workload: Workload,
    entry: ActivationProfile,
    at: tuple[int, int, int],
    elem: int,
    checkpointing: bool,
    tp: int,
) -> LayerActivations:
    """:func:`workload_activation_bytes` from the profile's ``entry``, ``at`` (micro-batch, a rank's tokens, the
    factor a profile traced at the whole sequence is divided by), on one of ``tp`` AutoTP ranks."""
    model, profile = workload.model, workload.profile
    micro_batch, seq, scale = at
    assert profile is not None
    saved = entry.saved_bytes(profile.layer_counts, micro_batch) // scale
    recompute = entry.recompute.at(micro_batch) // scale
    layers = saved - (entry.outside.at(micro_batch) + entry.first_extra.at(micro_batch)) // scale
    whole = tp_whole_layer_bytes(model, micro_batch, seq, elem, traced=True) if tp > 1 else 0
    if tp > 1 and model.routed_experts:  # experts stay whole under AutoTP: their block's activations too
        whole += entry.mlp_saved.at(micro_batch) // scale
    n_layers = model.num_layers
    peak, peak_outside_mlp, excess, excess_outside_mlp, mlp_saved = (
        tp_local_activations(saved, line.at(micro_batch) // scale, layers, whole, n_layers, True, tp)[1]
        for line in (
            entry.backward_peak,
            entry.backward_peak_outside_mlp,
            entry.backward_excess,
            entry.backward_excess_outside_mlp,
            entry.mlp_saved,
        )
    )
    saved, recompute = tp_local_activations(saved, recompute, layers, whole, n_layers, checkpointing, tp)
    # before the layers: masks can be s x s, so a profile at s scaled by 1/sp over-counts them (safe)
    pre_peak, pre_held = (line.at(micro_batch) // scale for line in (entry.pre_layer_peak, entry.pre_layer_held))
    outside = entry.outside.at(micro_batch) // scale
    return LayerActivations(
        saved, recompute, "trace", peak, peak_outside_mlp, pre_peak, pre_held, excess, excess_outside_mlp,
        outside, mlp_saved,
    )  # fmt: skip
