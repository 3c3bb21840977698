"""dstune's nn.MultiheadAttention transformer, and traces under a ds_config's torch_autocast."""

from __future__ import annotations

import pytest
import torch

from tuner.profile import model_from_config
from tuner.profile.autocast_trace import traced_autocast
from tuner.profile.hf import build
from tuner.profile.trace import trace_activations
from tuner.workload import ConfigError
from tuner.workload.autocast import autocast_dtype, trace_precision

MHA = {
    "model_type": "mha_transformer",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
SEQ, HEADS, H = 64, 4, 64


def test_parameters_are_the_scripts_model():
    """Embeddings, per layer 12h² + 13h (fused in-projection, out-projection, two LayerNorms, the 4h MLP, biases), an
    untied head with bias."""
    h, v = H, MHA["vocab_size"]
    spec = model_from_config(MHA, name="mha")
    assert spec.n_params == v * h + SEQ * h + 2 * (12 * h * h + 13 * h) + h * v + v
    assert spec.architecture == "MhaTransformerForCausalLM" and not spec.tie_embeddings


def test_trains_and_its_loss_is_unshifted_cross_entropy():
    model = build(MHA, dtype=torch.float32)
    tokens = torch.randint(0, MHA["vocab_size"], (2, 16))
    out = model(input_ids=tokens, labels=tokens)
    expected = torch.nn.functional.cross_entropy(out.logits.view(-1, MHA["vocab_size"]), tokens.view(-1))
    assert torch.equal(out.loss, expected)
    out.loss.backward()
    assert model.layers[0].attention.in_proj_weight.grad is not None


def test_trace_counts_the_attention_weights_need_weights_saves():
    """Each layer saves its softmax output, [heads, s, s] in bf16: the traced layer is above it, and it grows as s²."""
    short, long = (trace_activations(MHA, ["MhaBlock"] * 2, s, "bf16", "eager", (False,))[False] for s in (32, 64))
    layer = {s: next(iter(entry.layers.values())).at(1) for s, entry in ((32, short), (64, long))}
    assert layer[64] > 2 * HEADS * 64 * 64
    assert layer[64] - 2 * layer[32] >= 2 * HEADS * (64 * 64 - 2 * 32 * 32)  # the s² term


def test_cuda_autocast_policy_saves_fp32_norms_and_softmax():
    """Under CUDA's autocast policy the LayerNorms and the softmax run (and save) fp32: more than CPU's policy, which
    leaves them bf16; the policy's kernels are gone after the trace."""
    traced = {
        device: trace_activations(
            MHA, ["MhaBlock"] * 2, SEQ, trace_precision("bf16", "bf16", device), "eager", (False,)
        )
        for device in ("cpu", "cuda")
    }
    layer = {device: next(iter(entry[False].layers.values())).at(1) for device, entry in traced.items()}
    assert layer["cuda"] - layer["cpu"] >= 4 * HEADS * SEQ * SEQ  # the fp32 softmax beside its bf16 copy
    norm = torch.nn.LayerNorm(8, dtype=torch.bfloat16)
    with traced_autocast(trace_precision("bf16", "bf16", "cuda")):
        assert norm(torch.ones(2, 8, dtype=torch.bfloat16)).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(torch.ones(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_autocast_section_read_as_deepspeed_reads_it():
    on = {"torch_autocast": {"enabled": True, "dtype": "torch.float16"}}
    assert autocast_dtype(on, "cuda") == "fp16"
    assert autocast_dtype({"torch_autocast": {"enabled": False}}, "cuda") == ""
    assert autocast_dtype({"torch_autocast": {"enabled": True}}, "cuda") == "fp16"  # torch.autocast's CUDA default
    with pytest.raises(ConfigError, match=r"torch_autocast\.dtype"):
        autocast_dtype({"torch_autocast": {"enabled": True, "dtype": "int8"}}, "cuda")


def test_its_loss_workspace_is_in_the_logits_dtype_and_fp32_under_autocast():
    """The loss runs in the logits' dtype (no fp32 upcast as Hugging Face's): its backward holds two bsV tensors of
    the log-softmax's dtype, fp32 under autocast; the autocast run reads the activations traced under it."""
    from tuner.estimator import estimate
    from tuner.profile import with_profile
    from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload

    work = Workload(
        model_from_config(MHA, name="mha"),
        ClusterSpec(gpus_per_node=2, device="cpu"),
        TrainSpec(SEQ, attention="eager"),
    )
    autocast = trace_precision("bf16", "bf16", "cpu")
    work = with_profile(work, precisions=("bf16", autocast))
    plain = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    under = {**plain, "torch_autocast": {"enabled": True, "dtype": "bfloat16"}}
    bsv = SEQ * MHA["vocab_size"]
    assert estimate(work, TrialConfig(plain)).details["logits_workspace"] == 2 * 2 * bsv
    est, base = estimate(work, TrialConfig(under)), estimate(work, TrialConfig(plain))
    assert est.details["logits_workspace"] == 2 * 4 * bsv
    layers = {kind: work.profile.layer_kinds.count(kind) for kind in set(work.profile.layer_kinds)}
    traced = {e.precision: e.saved_bytes(layers, 1) for e in work.profile.activations if not e.checkpointing}
    assert traced[autocast] > traced["bf16"]  # the fp32 log-softmax
    gap = est.phases["forward"].gpu["activations"] - base.phases["forward"].gpu["activations"]
    assert gap == traced[autocast] - traced["bf16"]
