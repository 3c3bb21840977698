"""The one workload schema (``tuner.schema``): vocabularies agree with the rooms that check them, bad input is one
FieldError with the field's path, and inline configs are named as asked."""

from __future__ import annotations

import pytest

from tuner import workload
from tuner.estimator.settings import OFFLOAD_DEVICES
from tuner.schema import (
    ATTENTION_KINDS,
    OFFLOAD_TARGETS,
    PRECISIONS,
    SAMPLERS,
    FieldError,
    WorkloadRequest,
    to_workload,
    validated,
)
from tuner.study.loop import SAMPLERS as LOOP_SAMPLERS
from tuner.workload import preset_config


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
