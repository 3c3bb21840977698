"""The numerics-changing choices a ds_config makes, refused where DeepSpeed 0.19.8 refuses them (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.workload import ConfigError, Numerics, TrialConfig, numerics_config


def config(stage: int = 2, offload: bool = False, **bf16: Any) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"bf16": {"enabled": True, **bf16}, "zero_optimization": zero}


def test_no_choice_is_the_reference() -> None:
    choices = Numerics.of(config())
    assert choices == Numerics() and not choices.any and choices.labels() == []


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_master_and_states_on_the_device(stage: int) -> None:
    choices = Numerics.of(config(stage, bf16_master_weights_and_grads=True, bf16_optimizer_states=True))
    assert choices.bf16_master and choices.bf16_optimizer_states and choices.changes_numerics


@pytest.mark.parametrize("states", [False, True])
def test_bf16_master_with_offload_builds_cpu_adam(states: bool) -> None:
    assert Numerics.of(config(3, True, bf16_master_weights_and_grads=True, bf16_optimizer_states=states)).bf16_master


@pytest.mark.parametrize(
    ("ds_config", "key", "words"),
    [
        (config(0, bf16_master_weights_and_grads=True, bf16_optimizer_states=True), "bf16_master", "stage 1, 2 or 3"),
        (config(2, bf16_master_weights_and_grads=True), "bf16_master", "optimizer offload"),
        (config(2, bf16_optimizer_states=True), "bf16_optimizer_states", "needs bf16.bf16_master"),
        ({"bf16": {"bf16_master_weights_and_grads": True}, "zero_optimization": {"stage": 2}}, "bf16_master", "bf16"),
        (
            {
                **config(2, True, bf16_master_weights_and_grads=True),
                "optimizer": {"type": "AdamW", "params": {"torch_adam": True}},
            },
            "bf16_master",
            "DeepSpeedCPUAdam",
        ),
        ({**config(3), "optimizer": {"type": "Muon"}}, "optimizer.type", "stage 1 or 2"),
    ],
)
def test_refused_as_deepspeed_refuses(ds_config: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Numerics.of(ds_config)
    assert key in caught.value.field and words in caught.value.message


def test_muon_and_chunked_loss_are_read_and_described() -> None:
    trial = TrialConfig({**config(1), **numerics_config(optimizer="muon", chunked_loss=True)})
    assert trial.numerics == Numerics(muon=True, chunked_loss=True)
    assert trial.summary() == "ZeRO-1 · bf16 · Muon optimizer · chunked cross-entropy loss"
    assert not Numerics(chunked_loss=True).changes_numerics  # the same loss: a code path, not the numerics


def test_a_bad_value_names_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        Numerics.of(config(2, bf16_master_weights_and_grads="yes"))
    assert caught.value.field == "bf16.bf16_master_weights_and_grads"
