"""Activation formulas against the bytes autograd really saves in the built-in models (pure torch, no DeepSpeed)."""

import pytest

torch = pytest.importorskip("torch")

from tuner.estimator.activations.saved import activation_bytes  # noqa: E402
from tuner.measure.rank.memory_probe import count_saved_activations  # noqa: E402
from tuner.measure.rank.models import build_model, synthetic_batch  # noqa: E402
from tuner.workload import model_from_hf_config  # noqa: E402

SHAPES = {
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 384,
        "n_positions": 128,
        "n_embd": 96,
        "n_layer": 3,
        "n_head": 6,
        "n_inner": 200,
    },
    "llama-gqa": {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    },
    "qwen2": {
        "model_type": "qwen2",
        "vocab_size": 512,
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "max_position_embeddings": 128,
    },
}


def saved_bytes(spec, batch: int, seq: int, dtype, attention: str, checkpointing: bool) -> int:
    model = build_model(spec, attention=attention, checkpointing=checkpointing).to(dtype)
    tokens, targets = synthetic_batch(spec, batch, seq)
    with count_saved_activations(model.parameters()) as saved:
        loss = model(tokens, targets)
    loss.backward()
    return saved["bytes"]


@pytest.mark.parametrize("family", sorted(SHAPES))
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(("attention", "checkpointing"), [("sdpa", False), ("eager", False), ("sdpa", True)])
@pytest.mark.parametrize(("batch", "seq"), [(1, 48), (3, 96)])
def test_activation_estimate_within_two_percent(family, dtype, attention, checkpointing, batch, seq) -> None:
    spec = model_from_hf_config(SHAPES[family])
    torch_dtype, elem = (torch.bfloat16, 2) if dtype == "bf16" else (torch.float32, 4)
    measured = saved_bytes(spec, batch, seq, torch_dtype, attention, checkpointing)
    estimated, _ = activation_bytes(spec, batch, seq, elem, attention, checkpointing)
    assert estimated == pytest.approx(measured, rel=0.02)


def test_eager_attention_costs_the_score_matrix() -> None:
    spec = model_from_hf_config(SHAPES["gpt2"])
    sdpa, _ = activation_bytes(spec, 2, 128, 2, "sdpa", False)
    eager, _ = activation_bytes(spec, 2, 128, 2, "eager", False)
    assert eager - sdpa >= spec.num_layers * 2 * 2 * spec.num_heads * 128 * 128
