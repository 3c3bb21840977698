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
  instead of the head's input and the fp32 log-softmax (``4·T·V``). No fp32 copy of the chunk: its kernel reads the
  logits, computes in fp32 registers and writes their gradient over them. Beside the chunk the loss's moment holds
  the fp32 per-token loss (``loss_1d``, ``4·T``) and the bool mask of counted targets (``T``); on a GPU of compute
  capability below 8.0 (V100) the head's gradient is accumulated through the legacy path,
  ``grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()``: an ``e·V·h`` product and its ``4·V·h``
  fp32 copy per chunk (:func:`liger_loss`).
* Qwen3's and OLMo2's attention normalise q and k (``q_norm``, ``k_norm``: transformers' ``Qwen3RMSNorm(head_dim)``
  on ``q_proj(x).view(..., heads, head_dim)``, ``Olmo2RMSNorm(heads·head_dim)`` on ``q_proj(x)``), and Liger patches
  the model's RMSNorm class, so these are ``LigerRMSNorm`` too: each saves its input, the projection's output
  (``e·T·(dq + dkv)`` per layer), and an fp32 ``RSTD`` per normalised row (:func:`liger_qk_norm_saved`).

So a layer saves (attention's q, k, v, output and fp32 log-sum-exp as flash/SDPA keep them, key-value heads not
expanded) ``e·T·(4h + 2·dq + 2·dkv + 3f) + 8·T + 4·b·a·s``, with q and k norms their saved tensors beside
(:func:`liger_layer_saved`). Recomputed in backward
(checkpointing), its worst moment (:func:`liger_backward_peaks`) is the largest of: the down projection's backward
(every saved tensor, the incoming gradient and ``dc``), the gate and up projections' (two ``[T, h]`` partial
gradients), the attention's backward (its saved tensors, the incoming gradient, ``d_out``, ``dq``, ``dk``, ``dv``,
flash's fp32 ``dq`` accumulator and softmax statistics; expanded ``dk``/``dv`` with grouped-query heads) and the
q/k/v projections'. Liger patches many model types; estimated here are the dense ones with RMSNorm, SwiGLU and
rotary positions whose norm runs in place (:data:`LIGER_TYPES`).
"""

from __future__ import annotations

from tuner.estimator.activations.saved import LayerActivations, head_activation_bytes
from tuner.estimator.settings import FP32
from tuner.estimator.terms import Contribution, detail
from tuner.workload import GPU_TYPES, ConfigError, ModelSpec
from tuner.workload.numerics import LIGER_KEY

LIGER_TYPES = frozenset({"llama", "mistral", "ministral", "qwen2", "qwen3", "granite", "olmo2", "smollm3", "phi3"})
QK_NORM_PER_HEAD = frozenset({"qwen3"})  # q_norm/k_norm over head_dim: an RSTD per token and head
QK_NORM_WHOLE = frozenset({"olmo2"})  # q_norm/k_norm over the whole projection: an RSTD per token
TENSOR_CORE_ACCUMULATE = 80  # compute capability from which Liger accumulates grad_weight with addmm in place


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


def compute_capability(gpu_type: str) -> int:
    """The compute capability (major·10 + minor) of a ``--gpu-type``; an H100's when none is given (the default card's
    CUDA terms are an H100's too)."""
    return GPU_TYPES[gpu_type or "h100-80gb"].compute_capability


def _widths(model: ModelSpec) -> tuple[int, int, int, int]:
    """(h, f, query width, key-value width) of one layer."""
    head_dim = model.head_dim or model.hidden_size // max(1, model.num_heads)
    kv = model.num_kv_heads or model.num_heads
    return model.hidden_size, model.intermediate_size, model.num_heads * head_dim, kv * head_dim


def liger_qk_norm_saved(model: ModelSpec, tokens: int, elem: int) -> int:
    """What one layer's q and k norms save under Liger (module docstring): their inputs and fp32 ``RSTD`` rows; 0
    for model types without them.

    >>> qwen3 = ModelSpec("m", "qwen3", hidden_size=4096, num_heads=32, num_kv_heads=8)  # dq 4096, dkv 1024
    >>> liger_qk_norm_saved(qwen3, 1000, 2)  # 2·1000·(4096 + 1024) + 4·1000·(32 + 8)
    10400000
    """
    _, _, dq, dkv = _widths(model)
    if model.family in QK_NORM_PER_HEAD:
        rows = tokens * (model.num_heads + (model.num_kv_heads or model.num_heads))
    elif model.family in QK_NORM_WHOLE:
        rows = 2 * tokens
    else:
        return 0
    return elem * tokens * (dq + dkv) + FP32 * rows


def liger_layer_saved(model: ModelSpec, batch: int, seq: int, elem: int) -> int:
    """Bytes one layer saves for backward under Liger's kernels (module docstring).

    >>> from tuner.workload import load_builtin_model
    >>> liger_layer_saved(load_builtin_model("llama-3-8b"), 1, 1024, 2) / 2**20  # 1,024 tokens, bf16
    136.1328125
    """
    h, f, dq, dkv = _widths(model)
    tokens = batch * seq
    norms = 2 * FP32 * tokens + liger_qk_norm_saved(model, tokens, elem)
    return elem * tokens * (4 * h + 2 * dq + 2 * dkv + 3 * f) + norms + FP32 * batch * model.num_heads * seq


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
    qk_norms = liger_qk_norm_saved(model, tokens, elem)  # held until after the attention's backward
    before_attention = 2 * hidden + attention + norm_stats // 2 + qk_norms  # the first norm's, q/k norms', attention's
    expanded = 2 * elem * tokens * dq if dkv < dq else 0  # flash's dk, dv over every query head, then summed
    grads = elem * tokens * (dq + 2 * dkv) + expanded
    attention_backward = before_attention + hidden + elem * tokens * dq + grads + FP32 * tokens * dq + lse
    qkv_backward = 2 * hidden + norm_stats // 2 + hidden + elem * tokens * (dq + 2 * dkv) + 2 * hidden
    outside_mlp = max(attention_backward, qkv_backward)
    return max(down, gate_up, outside_mlp), outside_mlp


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of logits the fused linear cross-entropy computes at a time: ``fused_linear_cross_entropy_forward``'s
    ``min(triton.next_power_of_2(cdiv(BT, cdiv(V, H))), BT)`` (``chunk_mem_const`` 1, its default).

    >>> liger_chunk_rows(8192, 128256, 4096), liger_chunk_rows(218750, 151936, 5120), liger_chunk_rows(9, 128256, 4096)
    (256, 8192, 1)
    """
    rows = -(-tokens // max(1, -(-vocab // hidden)))
    return min(1 << max(0, rows - 1).bit_length(), tokens)


def liger_loss(model: ModelSpec, tokens: int, elem: int, capability: int = 90) -> tuple[int, int]:
    """(saved bytes Liger's final norm and fused linear cross-entropy change against Hugging Face's, the loss's
    workspace): ``X``, ``RSTD``, ``grad_input`` and ``grad_weight`` instead of the norm's fp32 copies, the head's
    input and the fp32 log-softmax; one chunk of logits, the fp32 per-token loss and the target mask, and below
    compute capability 8.0 (``capability``: major·10 + minor) the legacy accumulation's product and its fp32 copy
    (module docstring).

    >>> llama = ModelSpec("m", "llama", vocab_size=128256, hidden_size=4096)
    >>> liger_loss(llama, 8192, 2)[1] // 2**20, liger_loss(llama, 8192, 2, capability=70)[1] // 2**20  # 256 rows
    (62, 3068)
    """
    h, vocab = model.hidden_size, model.vocab_size
    liger = elem * tokens * h + FP32 * tokens + elem * tokens * h + elem * vocab * h
    hugging_face = (elem + 2 * FP32) * tokens * h + FP32 * tokens * vocab
    workspace = elem * liger_chunk_rows(tokens, vocab, h) * vocab + (FP32 + 1) * tokens
    if capability < TENSOR_CORE_ACCUMULATE:
        workspace += (elem + FP32) * vocab * h
    return liger - hugging_face, workspace


def liger_activations(
    model: ModelSpec, activations: LayerActivations, at: tuple[int, int, int], checkpointing: bool, capability: int = 90
) -> tuple[LayerActivations, int, Contribution]:
    """The model's activations, the loss's workspace and the figures Liger records, from ``activations`` (Hugging
    Face's layers, traced or by formula) at ``at`` = (micro-batch, a rank's tokens per sample, element size), on a
    GPU of compute ``capability`` (major·10 + minor).

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
    changed, workspace = liger_loss(model, tokens, elem, capability)
    if checkpointing:  # the layers keep their checkpointed inputs; the recomputed one is Liger's
        saved = activations.saved + changed
        acts = activations._replace(recompute=layer, peak=peak, peak_outside_mlp=outside_mlp)
    else:
        saved = outside + changed + model.num_layers * layer
        acts = activations._replace(excess=peak - layer, excess_outside_mlp=outside_mlp - layer)
    acts = acts._replace(saved=saved, outside=outside + changed, mlp_saved=liger_mlp_saved(model, tokens, elem))
    return acts, workspace, detail("liger_layer_saved", layer) + detail("liger_loss_saved", changed)


__all__ = [
    "LIGER_TYPES",
    "compute_capability",
    "liger_activations",
    "liger_backward_peaks",
    "liger_chunk_rows",
    "liger_layer_saved",
    "liger_loss",
    "liger_qk_norm_saved",
]
