"""ZeRO-3 with torch's own F.linear: the Linears' gathered weights held from forward to backward (pure arithmetic;
the truth it was checked against: ``bench/mha_true_peak.py``'s real runs and DeepSpeedExamples' published rows,
``bench/bf16_master_weight_rows.py``)."""

from __future__ import annotations

from typing import Any

from tuner.estimator import estimate
from tuner.estimator.states.saved_weights import held_weight_elements
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

LLAMA = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=512))


def config(memory_efficient_linear: bool, **zero: Any) -> dict[str, Any]:
    section = {"stage": 3, "memory_efficient_linear": memory_efficient_linear, **zero}
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": section}


def test_linear_weights_are_the_projections_and_the_untied_head():
    model = LLAMA.model
    h, f, v = model.hidden_size, model.intermediate_size, model.vocab_size
    assert held_weight_elements(LLAMA) == model.num_layers * (4 * h * h + 3 * h * f) + v * h
    assert held_weight_elements(Workload(load_builtin_model("gpt2"), ClusterSpec())) == 0  # Conv1D saves the weight


def test_torch_linear_holds_the_weights_beyond_those_kept_gathered():
    plain, efficient = (estimate(LLAMA, TrialConfig(config(flag))) for flag in (False, True))
    held = 2 * held_weight_elements(LLAMA)
    kept = efficient.details["gathered_parameters"]
    assert plain.details["saved_weight_views"] == held
    assert plain.phases["forward"].gpu_total - efficient.phases["forward"].gpu_total == held - kept
    assert plain.phases["backward"].gpu_total - efficient.phases["backward"].gpu_total == held


def test_nothing_held_with_checkpointing_or_below_stage_3():
    for trial in (
        TrialConfig(config(False), activation_checkpointing=True),
        TrialConfig({**config(False), "zero_optimization": {"stage": 2, "memory_efficient_linear": False}}),
    ):
        assert "saved_weight_views" not in estimate(LLAMA, trial).details
    one = Workload(LLAMA.model, ClusterSpec(gpus_per_node=1), LLAMA.train)  # the shard is the whole parameter
    assert "saved_weight_views" not in estimate(one, TrialConfig(config(False))).details
