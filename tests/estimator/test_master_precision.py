"""bf16 master weights and optimizer states and Muon in the estimate (pure arithmetic; the truth they were checked
against is ``bench/precision_true_peak.py``'s real runs, ``tests/estimator/test_precision_true_peak.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.estimator import estimate
from tuner.estimator.states.muon import muon_mask
from tuner.workload import (
    ClusterSpec,
    ConfigError,
    TrainSpec,
    Workload,
    load_builtin_model,
    model_from_param_count,
    numerics_config,
)

WORK = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64))
MASTER_AND_STATES = numerics_config(bf16_master=True, bf16_optimizer_states=True)


def config(stage: int, offload: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    base = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}
    for key, value in (extra or {}).items():
        base[key] = {**base.get(key, {}), **value}
    return base


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_master_and_states_hold_6_bytes_per_partition_element(stage: int) -> None:
    """The bf16 master (a copy of the shard, also at ZeRO-3) and two bf16 moments: 2 + 4 bytes where fp32 holds
    4 + 8; the step reads the bf16 gradient partition instead of an fp32 copy."""
    reference = estimate(WORK, config(stage))
    bf16 = estimate(WORK, config(stage, extra=MASTER_AND_STATES))
    part = bf16.details["partition_elements"]
    assert reference.phases["step"].gpu["optimizer_states"] == 12 * part
    assert bf16.phases["step"].gpu["optimizer_states"] == 6 * part
    step_grads = reference.phases["step"].gpu["gradients"] - bf16.phases["step"].gpu["gradients"]
    assert step_grads == 2 * (part if stage < 3 else min(part, int(1e9)))


@pytest.mark.parametrize(("states", "moments"), [(False, 8), (True, 4)])
def test_offloaded_bf16_master_keeps_the_moments_deepspeeds_cpu_adam_keeps(states: bool, moments: int) -> None:
    bf16 = estimate(WORK, config(2, True, numerics_config(bf16_master=True, bf16_optimizer_states=states)))
    part = bf16.details["partition_elements"]
    host = bf16.phases["step"].cpu
    assert host["optimizer_states"] == (2 + moments) * part
    assert host["gradients"] == 2 * part  # the master's gradient, in bf16


def test_without_the_choices_nothing_changes() -> None:
    explicit = config(2, extra={"bf16": {"bf16_master_weights_and_grads": False}})
    assert estimate(WORK, explicit).per_gpu == estimate(WORK, config(2)).per_gpu


def test_muon_steps_the_matrices_and_adam_the_rest() -> None:
    model = WORK.model
    mask = muon_mask(model)
    adam = sum(n for n, on in zip(model.param_numels, mask, strict=True) if not on)
    assert adam == 2 * model.vocab_size * model.hidden_size + model.hidden_size * (2 * model.num_layers + 1)
    muon = estimate(WORK, config(2, extra={"optimizer": {"type": "Muon"}}))
    adamw = estimate(WORK, config(2))
    assert muon.phases["step"].gpu["optimizer_states"] < adamw.phases["step"].gpu["optimizer_states"]
    assert muon.details["muon_update"] > 0


def test_muon_needs_the_models_shapes() -> None:
    bare = Workload(model_from_param_count(1e6), WORK.cluster, WORK.train)
    with pytest.raises(ConfigError, match="shapes"):
        estimate(bare, config(2, extra={"optimizer": {"type": "Muon"}}))
