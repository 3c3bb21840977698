"""What a measured run refuses of AutoTP and ZeRO++: one line naming the field, before any rank starts."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.errors import InputError
from tuner.measure.layout_checks import AUTOTP_BUILT_IN, AUTOTP_PEFT, QUANTIZER_ON_CPU, layout_refusal
from tuner.measure.run import run_measurement
from tuner.workload import ClusterSpec, TrainableSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

HF_TINY = replace(load_builtin_model("tiny-llama"), implementation="transformers")  # the checks read shapes only
TINY = Workload(HF_TINY, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64))


@pytest.mark.parametrize("key", ["zero_quantized_weights", "zero_quantized_gradients"])
def test_qwz_and_qgz_are_estimate_only_on_cpu_ranks(key: str) -> None:
    trial = TrialConfig({"zero_optimization": {"stage": 3, key: True}})
    with pytest.raises(InputError) as refused:
        run_measurement(TINY, trial)
    assert refused.value.field == f"zero_optimization.{key}"
    assert "QuantizerBuilder needs CUDA" in str(refused.value) and "\n" not in str(refused.value)
    assert layout_refusal(TINY, trial, "cuda") is None  # CUDA ranks can run them
    assert layout_refusal(TINY, TrialConfig({"zero_optimization": {"stage": 2, key: True}}), "cpu") is None


def test_autotp_with_zero3_needs_deepspeed_0_19_4() -> None:
    trial = TrialConfig({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 3}})
    assert layout_refusal(TINY, trial, "cpu", "0.19.3") == (
        "tensor_parallel.autotp_size",
        "AutoTP with ZeRO-3 needs DeepSpeed >= 0.19.4, this is 0.19.3",
    )
    assert layout_refusal(TINY, trial, "cpu", "0.19.4") is None
    zero2 = TrialConfig({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 2}})
    assert layout_refusal(TINY, zero2, "cpu", "0.18.0") is None  # ZeRO 0-2 with AutoTP is older than that


def test_the_installed_deepspeed_is_read_without_importing_it() -> None:
    code = (
        "import sys; from tuner.measure.layout_checks import installed_deepspeed; "
        "v = installed_deepspeed(); print(v, 'deepspeed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False" and (out[0] == "None" or out[0][0].isdigit())


def test_bad_hpz_is_refused_before_any_rank() -> None:
    with pytest.raises(InputError) as refused:
        run_measurement(TINY, TrialConfig({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}}))
    assert refused.value.field == "zero_optimization.zero_hpz_partition_size"
    assert QUANTIZER_ON_CPU not in str(refused.value)


def test_autotp_is_measured_on_the_transformers_model_without_an_adapter() -> None:
    """DeepSpeed shards by the transformers model's tp_plan: the built-in model has none, an adapter renames its
    Linears."""
    trial = TrialConfig({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 2}})
    built_in = Workload(load_builtin_model("tiny-llama"), TINY.cluster, TINY.train)
    with pytest.raises(InputError) as refused:
        run_measurement(built_in, trial)
    assert refused.value.field == "tensor_parallel.autotp_size" and AUTOTP_BUILT_IN in str(refused.value)
    lora = replace(TINY, trainable=TrainableSpec(peft='{"peft_type": "LORA", "r": 4}'))
    assert layout_refusal(lora, trial, "cpu") == ("tensor_parallel.autotp_size", AUTOTP_PEFT)


def test_an_moe_run_sent_without_its_profile_is_checked_with_the_models_tp_plan(tmp_path: Path) -> None:
    """A run's spec carries no profile: the ranks and the summary read AutoTP's split from the model's config
    again (transformers 5.25's Qwen2-MoE plan: attention only, which DeepSpeed takes), so the MoE run is not
    refused there after the CLI let it through."""
    pytest.importorskip("torch")
    from tuner.measure.layout_checks import with_tp_split
    from tuner.profile import load_model

    config = {
        "model_type": "qwen2_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    bare = Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64))
    trial = TrialConfig({"tensor_parallel": {"autotp_size": 2}})
    assert layout_refusal(bare, trial, "cpu") is not None  # no profile: the plan is unknown, refused
    checked = with_tp_split(bare, trial)
    assert checked.profile is not None and any(checked.profile.tp_sharded)
    assert layout_refusal(checked, trial, "cpu") is None
    assert with_tp_split(bare, TrialConfig({})) is bare  # nothing to check without AutoTP
