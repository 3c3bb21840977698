"""Liger-Kernel's fused kernels (``dstune.liger_kernel``: ``liger_kernel.transformers.apply_liger_kernel_to_<model
type>``, what HF's ``use_liger_kernel`` and LLaMA-Factory's ``enable_liger_kernel`` apply) in a decoder layer and
at the loss, from what liger-kernel 0.8.5's autograd functions save and allocate (``liger_kernel/ops``). Its kernels
need Triton on a GPU, so they are read, not traced: these are closed forms, a rank's tokens ``T`` (micro-batch ×
``s/sp``), element size ``e``.

* ``LigerRMSNormFunction`` (``rms_norm.py``, llama casting, ``in_place=True``): saves its input ``X`` and an fp32
  ``RSTD`` per row (``e·T·h + 4·T``) instead of Hugging Face's fp32 copies; its backward writes ``dX`` into ``dY``.
* ``LigerSiLUMulFunction`` (``swiglu.py``): saves the gate and up projections' outputs ``a``, ``b`` (``2·e·T·f``);
  its backward writes their gradients into them. The down projection saves ``c`` (``e·T·f``).
* ``LigerRopeFunction`` (``rope.py``): rotates q and k in place and saves ``cos``, ``sin`` (the model's one pair,
  shared by every layer): no rotated copies.
* ``LigerFusedLinearCrossEntropyFunction`` (``fused_linear_cross_entropy.py``): the logits never exist whole. In
  forward it computes the loss and the gradients chunk by chunk, ``chunk = min(2^⌈log2 ⌈T / ⌈V/h⌉⌉⌉, T)`` rows of
  ``e·V`` logits at a time, and saves ``grad_input`` (``e·T·h``) and ``grad_weight`` (the head's dtype, ``e·V·h``)
  instead of the head's input and the fp32 log-softmax (``4·T·V``).

So a layer saves (attention's q, k, v, output and fp32 log-sum-exp as flash/SDPA keep them, key-value heads not
expanded) ``e·T·(4h + 2·dq + 2·dkv + 3f) + 8·T + 4·b·a·s`` (:func:`liger_layer_saved`). Recomputed in backward
(checkpointing), its worst moment (:func:`liger_backward_peaks`) is the largest of: the down projection's backward
(every saved tensor, the incoming gradient and ``dc``), the gate and up projections' (two ``[T, h]`` partial
gradients), the attention's backward (its saved tensors, the incoming gradient, ``d_out``, ``dq``, ``dk``, ``dv``,
flash's fp32 ``dq`` accumulator and softmax statistics; expanded ``dk``/``dv`` with grouped-query heads) and the
q/k/v projections'. Liger patches many model types; estimated here are the dense ones with RMSNorm, SwiGLU and
rotary positions whose norm runs in place (:data:`LIGER_TYPES`).
"""

from __future__ import annotations

import math

from tuner.estimator.activations.saved import LayerActivations, head_activation_bytes
from tuner.estimator.settings import FP32
from tuner.estimator.terms import Contribution, detail
from tuner.workload import ConfigError, ModelSpec
from tuner.workload.numerics import LIGER_KEY

LIGER_TYPES = frozenset({"llama", "mistral", "ministral", "qwen2", "qwen3", "granite", "olmo2", "smollm3", "phi3"})


def liger_refusal(model: ModelSpec) -> str | None:
    """Why Liger's kernels are not estimated for ``model`` (None when they are).

    >>> from tuner.workload import load_builtin_model
    >>> liger_refusal(load_builtin_model("llama-3-8b")) is None, liger_refusal(load_builtin_model("gpt2"))
    (True, "estimated for the dense RMSNorm/SwiGLU/rotary model types Liger patches (llama, mistral, qwen2, ...), \
not 'gpt2'")
    """
    dense = model.norm == "rmsnorm" and model.gated_mlp and not model.routed_experts and not model.learned_positions
    if model.family in LIGER_TYPES and dense and not model.is_bare:
        return None
    return f"estimated for the dense RMSNorm/SwiGLU/rotary model types Liger patches (llama, mistral, qwen2, ...), \
not {model.family!r}"


def _widths(model: ModelSpec) -> tuple[int, int, int, int]:
    """(h, f, query width, key-value width) of one layer."""
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    kv = model.num_kv_heads or model.num_heads
    return model.hidden_size, model.intermediate_size, model.num_heads * head_dim, kv * head_dim


def liger_layer_saved(model: ModelSpec, batch: int, seq: int, elem: int) -> int:
    """Bytes one layer saves for backward under Liger's kernels (module docstring).

    >>> from tuner.workload import load_builtin_model
    >>> liger_layer_saved(load_builtin_model("llama-3-8b"), 1, 1024, 2) / 2**20  # 1,024 tokens, bf16
    136.1328125
    """
    h, f, dq, dkv = _widths(model)
    tokens = batch * seq
    return elem * tokens * (4 * h + 2 * dq + 2 * dkv + 3 * f) + 2 * FP32 * tokens + FP32 * batch * model.num_heads * seq


def liger_mlp_saved(model: ModelSpec, tokens: int, elem: int) -> int:
    """What one layer's MLP block saves under Liger: the norm's output, ``a``, ``b`` and ``c``."""
    h, f, _, _ = _widths(model)
    return elem * tokens * (h + 3 * f)


def liger_backward_peaks(model: ModelSpec, batch: int, seq: int, elem: int) -> tuple[int, int]:
    """(the recomputed layer's worst moment in backward, the same outside its MLP) under Liger's kernels (module
    docstring), its saved tensors included."""
    h, f, dq, dkv = _widths(model)
    tokens = batch * seq
    hidden, lse = elem * tokens * h, FP32 * batch * model.num_heads * seq
    attention = elem * tokens * (2 * dq + 2 * dkv) + lse
    norm_stats = 2 * FP32 * tokens
    saved = liger_layer_saved(model, batch, seq, elem)
    down = saved + hidden + elem * tokens * f
    gate_up = saved - elem * tokens * f + 3 * hidden
    before_attention = 2 * hidden + attention + norm_stats // 2  # the first norm's input and output, the attention's
    expanded = 2 * elem * tokens * dq if dkv < dq else 0  # flash's dk, dv over every query head, then summed
    grads = elem * tokens * (dq + 2 * dkv) + expanded
    attention_backward = before_attention + hidden + elem * tokens * dq + grads + FP32 * tokens * dq + lse
    qkv_backward = 2 * hidden + norm_stats // 2 + hidden + elem * tokens * (dq + 2 * dkv) + 2 * hidden
    outside_mlp = max(attention_backward, qkv_backward)
    return max(down, gate_up, outside_mlp), outside_mlp


def liger_loss(model: ModelSpec, tokens: int, elem: int) -> tuple[int, int]:
    """(saved bytes Liger's final norm and fused linear cross-entropy change against Hugging Face's, the loss's
    workspace): ``X``, ``RSTD``, ``grad_input`` and ``grad_weight`` instead of the norm's fp32 copies, the head's
    input and the fp32 log-softmax; one chunk of logits (module docstring).

    >>> liger_loss(ModelSpec("m", "llama", vocab_size=128256, hidden_size=4096), 8192, 2)[1] // 2**20  # 256 rows
    62
    """
    h, vocab = model.hidden_size, model.vocab_size
    liger = elem * tokens * h + FP32 * tokens + elem * tokens * h + elem * vocab * h
    hugging_face = (elem + 2 * FP32) * tokens * h + FP32 * tokens * vocab
    chunk = min(2 ** math.ceil(math.log2(max(1, -(-tokens // max(1, -(-vocab // h)))))), tokens)
    return liger - hugging_face, elem * chunk * vocab


def liger_activations(
    model: ModelSpec, activations: LayerActivations, at: tuple[int, int, int], checkpointing: bool
) -> tuple[LayerActivations, int, Contribution]:
    """The model's activations, the loss's workspace and the figures Liger records, from ``activations`` (Hugging
    Face's layers, traced or by formula) at ``at`` = (micro-batch, a rank's tokens per sample, element size).

    Raises:
        ConfigError: a model Liger's kernels are not estimated for (:func:`liger_refusal`).
    """
    refusal = liger_refusal(model)
    if refusal:
        raise ConfigError(LIGER_KEY, refusal)
    batch, seq, elem = at
    tokens = batch * seq
    layer = liger_layer_saved(model, batch, seq, elem)
    peak, outside_mlp = liger_backward_peaks(model, batch, seq, elem)
    outside = activations.outside or head_activation_bytes(model, batch, seq, elem)
    changed, workspace = liger_loss(model, tokens, elem)
    if checkpointing:  # the layers keep their checkpointed inputs; the recomputed one is Liger's
        saved = activations.saved + changed
        acts = activations._replace(recompute=layer, peak=peak, peak_outside_mlp=outside_mlp)
    else:
        saved = outside + changed + model.num_layers * layer
        acts = activations._replace(excess=peak - layer, excess_outside_mlp=outside_mlp - layer)
    acts = acts._replace(saved=saved, outside=outside + changed, mlp_saved=liger_mlp_saved(model, tokens, elem))
    return acts, workspace, detail("liger_layer_saved", layer) + detail("liger_loss_saved", changed)


__all__ = ["LIGER_TYPES", "liger_activations", "liger_backward_peaks", "liger_layer_saved", "liger_loss"]
