"""Each term of Liger's closed forms pinned to the line of liger-kernel 0.8.5 (or transformers) it is read from
(:mod:`tuner.estimator.activations.liger`'s docstring): q/k norms' saved tensors, the fused linear cross-entropy's
chunk rule and what its loss moment holds beside the chunk, the legacy accumulation below compute capability 8.0."""

from __future__ import annotations

import dataclasses
import json

from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.estimator.activations.liger import liger_backward_peaks, liger_layer_saved, liger_loss
from tuner.workload import ModelSpec, load_builtin_model

QWEN3 = ModelSpec(
    "qwen3-like", "qwen3", vocab_size=151936, hidden_size=5120, num_layers=2, num_heads=64, num_kv_heads=8,
    head_dim=128, intermediate_size=25600, norm="rmsnorm", gated_mlp=True,
)  # fmt: skip
T = 218_750  # Qwen3-32B at 7M tokens over 32 sequence-parallel ranks


def test_qwen3s_q_and_k_norms_save_their_inputs_and_an_rstd_per_head_row() -> None:
    """``Qwen3RMSNorm(head_dim)`` on ``q_proj(x).view(..., heads, head_dim)`` (transformers' modeling_qwen3), patched
    to ``LigerRMSNorm`` (``apply_liger_kernel_to_qwen3``: ``_patch_rms_norm_module(self_attn.q_norm)``), which saves
    ``X`` and an fp32 ``RSTD`` per row (``LigerRMSNormFunction.forward``)."""
    llama_twin = dataclasses.replace(QWEN3, family="llama")
    expected = 2 * T * (64 * 128 + 8 * 128) + 4 * T * (64 + 8)
    assert liger_layer_saved(QWEN3, 1, T, 2) - liger_layer_saved(llama_twin, 1, T, 2) == expected
    peak, outside_mlp = liger_backward_peaks(QWEN3, 1, T, 2)
    twin_peak, twin_outside = liger_backward_peaks(llama_twin, 1, T, 2)
    assert outside_mlp - twin_outside == expected  # held through the attention's backward
    assert peak - twin_peak == expected


def test_olmo2s_norms_span_the_whole_projection() -> None:
    """``Olmo2RMSNorm(heads·head_dim)`` on ``q_proj(x)``: one ``RSTD`` per token for q and one for k."""
    olmo2, twin = dataclasses.replace(QWEN3, family="olmo2"), dataclasses.replace(QWEN3, family="mistral")
    assert liger_layer_saved(olmo2, 1, 1000, 2) - liger_layer_saved(twin, 1, 1000, 2) == 2 * 1000 * 9216 + 8 * 1000


def test_the_loss_moment_holds_the_chunk_the_fp32_loss_and_the_target_mask() -> None:
    """``chunk_size = min(next_power_of_2(cdiv(BT, cdiv(V, H))), BT)`` rows of logits in the input's dtype
    (``logits_storage``), ``loss_1d`` fp32 per token, ``target_mask = target != ignore_index`` (bool per token)."""
    chunk = 8192  # cdiv(218750, cdiv(151936, 5120) = 30) = 7292 -> 8192
    assert liger_loss(QWEN3, T, 2)[1] == 2 * chunk * 151936 + 4 * T + T


def test_below_compute_capability_8_the_head_gradient_takes_the_legacy_path() -> None:
    """``grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()`` where addmm into ``grad_weight``
    needs ``get_device_capability()[0] >= 8``: a V100 holds the product and its fp32 copy beside the chunk."""
    model = load_builtin_model("tiny-llama")
    tokens, vocab, hidden = 4096, model.vocab_size, model.hidden_size
    assert liger_loss(model, tokens, 2, capability=70)[1] - liger_loss(model, tokens, 2, capability=80)[1] == (
        (2 + 4) * vocab * hidden
    )
    runner = CliRunner()
    base = ["estimate", "--model", "tiny-llama", "--model-impl", "builtin", "--seq-len", "4096", "--liger", "--json"]
    answers = {}
    for gpu in ("v100-32gb", "a100-80gb"):
        result = runner.invoke(app, [*base, "--gpu-type", gpu, "--precision", "fp16"])
        assert result.exit_code == 0, result.output
        answers[gpu] = json.loads(result.stdout)["details"]["logits_workspace"]
    assert answers["v100-32gb"] - answers["a100-80gb"] == (2 + 4) * vocab * hidden
