"""The one workload schema (``tuner.requests``): vocabularies agree with the rooms that check them, bad input is one
FieldError with the field's path, and inline configs are named as asked."""

from __future__ import annotations

import pytest

from tuner.requests import (
    ATTENTION_KINDS,
    MAX_WORLD_SIZE,
    OFFLOAD_TARGETS,
    PRECISIONS,
    SAMPLERS,
    FieldError,
    WorkloadRequest,
    to_workload,
    validated,
)
from tuner.requests import workload as inputs
from tuner.study.samplers import SAMPLERS as LOOP_SAMPLERS
from tuner.workload import OFFLOAD_DEVICES, preset_config
from tuner.workload import vocabulary as workload


def test_vocabularies_match_the_rooms_that_check_them() -> None:
    """What the faces offer is exactly what the workload, the estimator and the study loop accept."""
    assert set(PRECISIONS) == set(workload.PRECISIONS)
    assert set(ATTENTION_KINDS) == set(workload.ATTENTION_KINDS)
    assert set(OFFLOAD_TARGETS) == set(OFFLOAD_DEVICES)
    assert set(SAMPLERS) == set(LOOP_SAMPLERS)


@pytest.mark.parametrize(
    ("data", "loc", "message"),
    [
        pytest.param({"gpus": 0}, ("gpus",), "greater than or equal to 1", id="bound"),
        pytest.param({"precision": "fp8"}, ("precision",), "'bf16', 'fp16' or 'fp32'", id="vocabulary"),
        pytest.param({"params": float("inf")}, ("params",), "finite number", id="infinite"),
        pytest.param({"gpu_memory": "8" * 40}, ("gpu_memory",), "at most 32 characters", id="union-branch-given"),
        pytest.param({"colour": "red"}, ("colour",), "Extra inputs are not permitted", id="unknown-field"),
    ],
)
def test_validated_reports_one_field(data: dict, loc: tuple, message: str) -> None:
    with pytest.raises(FieldError) as caught:
        validated(WorkloadRequest, {"model": "tiny-gpt2", **data}, ("workload",))
    assert caught.value.loc == ("workload", *loc)
    assert message in caught.value.message


def test_validated_returns_the_model() -> None:
    request = validated(WorkloadRequest, {"model": "tiny-gpt2", "gpus": 2})
    assert isinstance(request, WorkloadRequest) and request.gpus == 2


def test_inline_config_name() -> None:
    config = {**preset_config("tiny-gpt2"), "_name_or_path": "hub/tiny"}
    assert to_workload(WorkloadRequest(config=config)).model.name == "hub/tiny"
    assert to_workload(WorkloadRequest(config=config), config_name="mine").model.name == "mine"
    same = to_workload(WorkloadRequest(config=config), config_name="tiny-gpt2")
    assert same == to_workload(WorkloadRequest(model="tiny-gpt2"))


def test_workload_errors_carry_the_request_path() -> None:
    with pytest.raises(FieldError) as caught:
        to_workload(WorkloadRequest(config={"model_type": "gpt2", "n_embd": 65, "n_head": 4}), ("workload",))
    assert caught.value.loc == ("workload", "config", "n_head")
    with pytest.raises(FieldError) as caught:
        to_workload(WorkloadRequest(model="tiny-gpt2", cpu_memory="0"))
    assert caught.value.loc == ("cpu_memory",)


class _NoProfiles:
    """A profiling service that must not be asked: the request is refused before any model is described."""

    def profile(self, *args: object) -> None:
        raise AssertionError("the profiling service was asked")


@pytest.mark.parametrize("impl", ["transformers", "builtin"])
@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"num_hidden_layers": 10**9}, ("workload", "config", "num_hidden_layers")),
        ({"num_hidden_layers": 10**7}, ("workload", "config", "num_hidden_layers")),
        ({"vocab_size": 2**40}, ("workload", "config", "vocab_size")),
        ({"text_config": {"hidden_size": 2**30}}, ("workload", "config", "text_config", "hidden_size")),
        # within every dimension's limit, but 1024 layers of 2^29-wide projections: counted, not built
        ({"num_hidden_layers": 256, "num_attention_heads": 4096, "head_dim": 2**17}, ("workload", "config")),
    ],
)
def test_hostile_configs_are_refused_before_any_model_is_described(
    monkeypatch: pytest.MonkeyPatch, impl: str, change: dict, loc: tuple
) -> None:
    monkeypatch.setattr(inputs, "default_service", _NoProfiles)
    request = WorkloadRequest(config={**preset_config("llama-2-7b"), **change}, model_impl=impl)
    with pytest.raises(FieldError) as caught:
        to_workload(request, ("workload",), inline=False)
    assert caught.value.loc == loc


def test_world_size_is_bounded() -> None:
    assert to_workload(WorkloadRequest(params=1e9, gpus=4096, nodes=MAX_WORLD_SIZE // 4096)).cluster.world_size == 2**17
    with pytest.raises(FieldError) as caught:
        to_workload(WorkloadRequest(params=1e9, gpus=4096, nodes=4096), ("workload",))
    assert caught.value.loc == ("workload", "nodes") and str(MAX_WORLD_SIZE) in caught.value.message
