"""AutoTP's split read from a transformers model's tp_plan (:mod:`tuner.profile.tp_plan`), against what DeepSpeed
0.19.8 held on each rank of real AutoTP runs (``bench/tp_true_peak.py``: elements a rank holds after
``deepspeed.initialize`` with ``autotp_size`` 2, recorded in ``bench/results/tp_true_peak.json``)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tuner.profile.hf import build  # noqa: E402
from tuner.profile.tp_plan import autotp_sharded, merged_plan  # noqa: E402

LLAMA = {
    "model_type": "llama", "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip
PHI = {
    "model_type": "phi", "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "partial_rotary_factor": 0.5, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip


def _model(config: dict[str, Any]) -> Any:
    with torch.device("meta"):
        return build(dict(config), dtype=torch.bfloat16)


@pytest.mark.parametrize(("config", "held"), [(LLAMA, 983_680), (PHI, 987_264)], ids=["llama", "phi"])
def test_a_ranks_parameters_are_deepspeeds(config: dict[str, Any], held: int) -> None:
    model = _model(config)
    mask = autotp_sharded(model)
    numels = [param.numel() for _, param in model.named_parameters()]
    assert sum(-(-n // 2) if on else n for n, on in zip(numels, mask, strict=True)) == held


def test_column_biases_go_with_their_weights_row_biases_stay_whole() -> None:
    model = _model(PHI)
    split = dict(zip((name for name, _ in model.named_parameters()), autotp_sharded(model), strict=True))
    layer = "model.layers.0."
    assert split[layer + "self_attn.q_proj.bias"] and split[layer + "mlp.fc1.bias"]  # column: sharded
    assert split[layer + "self_attn.dense.weight"] and not split[layer + "self_attn.dense.bias"]  # row
    assert not split[layer + "input_layernorm.weight"] and not split["model.embed_tokens.weight"]
    assert split["lm_head.weight"] and split["lm_head.bias"]  # the class's plan: colwise_gather_output
    assert merged_plan(model)["lm_head"] == "colwise_gather_output"


def test_a_tied_head_stays_whole_and_a_plan_deepspeed_rejects_gives_nothing() -> None:
    tied = _model({**LLAMA, "tie_word_embeddings": True})
    names = [name for name, _ in tied.named_parameters()]
    assert "lm_head.weight" not in names  # listed once, as the embedding: whole
    assert not autotp_sharded(tied)[names.index("model.embed_tokens.weight")]
    model = _model(LLAMA)
    model._tp_plan = {"layers.*.mlp.experts": "moe_tp_experts"}  # a style DeepSpeed rejects the whole plan for
    assert autotp_sharded(model) == ()
