"""Model FLOPs per token for a looped model: each run of a looped layer costs what a layer of its own would."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tuner.estimator.throughput.flops import backward_flops_per_token, forward_flops_per_token, model_flops_per_token
from tuner.workload import model_from_hf_config

LLAMA = {"model_type": "llama", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 688,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4}  # fmt: skip
LOOP = {"n_recurrent_loops": 3, "n_input_layers": 1, "n_recurrent_layers": 2}  # layers 1-2 run 3 times: 8 runs


def test_a_looped_block_costs_each_run() -> None:
    """Dory-style: 4 layers whose middle two run three times cost what 8 plain layers cost (same shapes), forward
    and backward; before, they cost what 4 did."""
    looped = replace(model_from_hf_config(LLAMA), hf_config=json.dumps({**LLAMA, **LOOP}))
    unrolled = model_from_hf_config({**LLAMA, "num_hidden_layers": 8})
    plain = model_from_hf_config(LLAMA)
    assert looped.layer_passes == 8 and looped.n_params == plain.n_params
    for count in (forward_flops_per_token, backward_flops_per_token, model_flops_per_token):
        assert count(looped, 1024) == pytest.approx(count(unrolled, 1024), rel=1e-3)
        assert count(looped, 1024) > 1.5 * count(plain, 1024)


def test_a_loop_of_one_or_a_partial_config_is_no_loop() -> None:
    for loop in ({**LOOP, "n_recurrent_loops": 1}, {"n_recurrent_loops": 3}, {**LOOP, "n_input_layers": True}):
        model = replace(model_from_hf_config(LLAMA), hf_config=json.dumps({**LLAMA, **loop}))
        assert model.layer_passes == 4
        assert model_flops_per_token(model, 512) == model_flops_per_token(model_from_hf_config(LLAMA), 512)
