"""AutoEP on a rank (no DeepSpeed run): what a measured run refuses, the ds_config the runner hands DeepSpeed so that
AutoEP finds the MoE blocks inside its wrapper, and the transformers 5.24 registry shim."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from tiny_configs import TINY_CONFIGS

from tuner.measure.layout_checks import AUTOEP_BUILT_IN, AUTOEP_CUDA, AUTOEP_PEFT, layout_refusal
from tuner.measure.rank.layouts.autoep import expose_moe_layers, registry_shim
from tuner.workload import ClusterSpec, ModelSpec, TrainableSpec, TrialConfig, Workload

EP = {"enabled": True, "autoep_size": 2}
MIXTRAL = json.dumps({"model_type": "mixtral", "num_local_experts": 4})


def work(impl: str = "transformers") -> Workload:
    model = ModelSpec("m", "mixtral", hidden_size=64, implementation=impl, hf_config=MIXTRAL)
    return Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"))


@pytest.mark.parametrize(
    ("workload", "extra", "field", "reason"),
    [
        (work("builtin"), {}, "expert_parallel.autoep_size", AUTOEP_BUILT_IN),
        (replace(work(), trainable=TrainableSpec(freeze="embed")), {}, "expert_parallel.autoep_size", AUTOEP_PEFT),
        (work(), {"comm_backend": "deepep"}, "expert_parallel.comm_backend", AUTOEP_CUDA),
        (work(), {"async_split_plan": True}, "expert_parallel.async_split_plan", AUTOEP_CUDA),
    ],
)
def test_what_a_cpu_run_cannot_measure_is_refused(workload: Workload, extra: dict, field: str, reason: str) -> None:
    trial = TrialConfig({"expert_parallel": {**EP, **extra}})
    assert layout_refusal(workload, trial, "cpu", "0.19.8") == (field, reason)
    assert layout_refusal(work(), TrialConfig({"expert_parallel": EP}), "cpu", "0.19.8") is None


def test_the_wrapper_gets_the_config_and_a_prefixed_pattern() -> None:
    from tuner.measure.rank.models import build_transformers_model

    config = {**TINY_CONFIGS["mixtral"], "num_hidden_layers": 1}
    model = build_transformers_model(config, "sdpa")
    handed = expose_moe_layers(model, {"expert_parallel": EP})
    assert handed["expert_parallel"]["moe_layer_pattern"] == r"model\.model\.layers\.\d+\.mlp"
    assert model.config.model_type == "mixtral"
    assert "model.model.layers.0.mlp" in dict(model.named_modules())
    mine = {"expert_parallel": {**EP, "moe_layer_pattern": "x"}}
    assert expose_moe_layers(model, mine)["expert_parallel"]["moe_layer_pattern"] == "x"  # the config's own wins


def test_the_registry_shim_takes_deepspeeds_dict_calls_and_keeps_transformers_own() -> None:
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

    assert registry_shim()
    missing = object()
    assert _CAN_RECORD_REGISTRY.get("<class 'nobody'>", missing) is missing  # DeepSpeed's call
    _CAN_RECORD_REGISTRY["<class 'somebody'>"] = {"x": 1}  # DeepSpeed restores entries by key
    assert _CAN_RECORD_REGISTRY.get("<class 'somebody'>") == {"x": 1}
    dict.pop(_CAN_RECORD_REGISTRY, "<class 'somebody'>")
    assert _CAN_RECORD_REGISTRY.get(object()) == {}  # transformers' call, with a model
