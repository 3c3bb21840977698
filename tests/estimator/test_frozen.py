"""The estimator with frozen parameters (pure arithmetic; real DeepSpeed in test_peft_deepspeed.py): gradients,
masters and Adam states for trainable parameters only; frozen weights whole on every rank at ZeRO 0-2, partitioned
at ZeRO-3; full fine-tuning untouched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.estimator.states.partitions import flat_partition
from tuner.workload import (
    ClusterSpec,
    ModelProfile,
    TrainableSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    load_builtin_model,
)

pytest.importorskip("torch")


def frozen_embedding(world: int = 2) -> tuple[Workload, Workload, int]:
    """tiny-llama with its embedding frozen (the profile marked by hand), the same model fully trained, and the
    embedding's elements."""
    from tuner.profile import params_profile
    from tuner.workload import preset_config

    base = params_profile(preset_config("tiny-llama"))
    mask = tuple(index != 0 for index in range(len(base.param_numels)))  # model.embed_tokens.weight comes first
    trained = ModelProfile(
        **{**base._static_fields(), "trainable": mask, "param_dtypes": ("bf16",) * len(mask)},
        activations=base.activations,
    )
    full = Workload(
        load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=world, device="cpu"), TrainSpec(seq_len=64)
    )
    frozen = replace(full, profile=trained, trainable=TrainableSpec(freeze="embed_tokens"))
    return frozen, full, base.param_numels[0]


def config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_states_only_for_trainable_parameters(stage: int) -> None:
    frozen, full, embed = frozen_embedding()
    est, whole = estimate(frozen, config(stage)), estimate(full, config(stage))
    n = full.model.n_params
    trainable = n - embed
    assert est.n_params == n and est.trainable_params == trainable and whole.trainable_params is None
    assert est.to_dict()["trainable_params"] == trainable and whole.to_dict()["trainable_params"] == n
    step, step_whole = est.phases["step"].gpu, whole.phases["step"].gpu
    if stage == 0:
        assert step["optimizer_states"] == 12 * trainable
        assert step["parameters"] == step_whole["parameters"] == 2 * n  # frozen ones too, in bf16
    elif stage in (1, 2):
        part = flat_partition(tuple(x for x in full.model.param_numels[1:]), 2)
        assert step["optimizer_states"] == 12 * part.partition
        assert step["parameters"] == 2 * (part.padded_total + embed)  # frozen: replicated, outside the groups
    else:
        shard = est.details["trainable_partition_elements"]
        assert shard == sum(-(-x // 2) for x in full.model.param_numels[1:])
        assert step["optimizer_states"] == 12 * shard
        assert step["parameters"] == step_whole["parameters"]  # everything partitioned, frozen or not
    assert step["optimizer_states"] < step_whole["optimizer_states"]


def test_a_trainable_part_needs_its_profile() -> None:
    frozen, _, _ = frozen_embedding()
    with pytest.raises(WorkloadError, match="freeze"):
        estimate(replace(frozen, profile=None), config(2))


def test_zero3_keeps_gathered_only_what_backward_revisits() -> None:
    """After forward ZeRO-3 keeps gathered the parameters backward will reuse: a frozen input embedding is never
    run by backward (measured: released after forward), unless it is tied to the LM head, which backward runs."""
    frozen, _, embed = frozen_embedding()
    kept = {
        tied: estimate(replace(frozen, model=replace(frozen.model, tie_embeddings=tied)), config(3)).details
        for tied in (False, True)
    }
    assert kept[True]["gathered_parameters"] - kept[False]["gathered_parameters"] == 2 * embed  # bf16


def test_experts_as_modules_of_their_own_keep_nothing_gathered() -> None:
    """Experts that are modules of their own run only for routed tokens: the module order changes every step,
    DeepSpeed keeps no trace and releases each module after use; fused experts (one module) keep it."""
    _, full, _ = frozen_embedding()
    assert full.profile is None or not full.profile.expert_modules
    from tuner.profile import params_profile
    from tuner.workload import preset_config

    base = params_profile(preset_config("tiny-llama"))
    fused = replace(full, profile=base)
    routed = replace(full, profile=replace(base, expert_modules=True))
    kept = estimate(fused, config(3)).details
    dropped = estimate(routed, config(3)).details
    assert kept["gathered_parameters"] > 0 and dropped["gathered_parameters"] == 0
    assert dropped["stage3_working_set"] > kept["stage3_working_set"] == 0


def test_zero3_refuses_trainable_parameters_of_two_dtypes() -> None:
    """peft's fp32 adapters beside a 16-bit ``modules_to_save`` copy: DeepSpeed's stage-3 optimizer asserts one
    dtype, so the config is refused naming the field (ZeRO 0-2 and fp32 training are fine)."""
    from tuner.estimator import ConfigError

    frozen, _, _ = frozen_embedding()
    assert frozen.profile is not None
    dtypes = ("fp32", *frozen.profile.param_dtypes[1:])  # the embedding trains, in fp32
    mask = (True, *frozen.profile.trainable[1:])
    mixed = replace(frozen, profile=replace(frozen.profile, param_dtypes=dtypes, trainable=mask))
    with pytest.raises(ConfigError, match="one dtype") as refused:
        estimate(mixed, config(3))
    assert refused.value.field == "zero_optimization.stage"
    assert estimate(mixed, config(2)).per_gpu["total"]
    fp32 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    assert estimate(replace(mixed, train=replace(mixed.train, precision="fp32")), fp32).per_gpu["total"]
