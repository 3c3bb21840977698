"""ALST's tiled loss in the forward phase (pure arithmetic; its truth is ``bench/sp_true_peak.py``'s counting
allocator, read at marks inside the shard function): the LM head's accumulated gradient at every stage, ZeRO-1/2's
first reduce bucket in the training dtype, and no whole ZeRO-3 parameter at the loss's moment."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, ModelProfile, TrainableSpec, TrainSpec, Workload, load_builtin_model

SEQ = 4096


def llama(gpus: int = 2) -> Workload:
    return Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=gpus), TrainSpec(seq_len=SEQ))


def config(stage: int, sp: int = 2, shards: int = 8, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
        "sequence_parallel_size": sp,
        "dstune": {"tiled_loss_shards": shards},
    }


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_heads_gradient_accumulates_across_shards_in_forward(stage: int) -> None:
    """DeepSpeed is told the head's gradient is not ready until the last shard: it is a tensor of its own, beside
    every shard's workspace, whatever the bucket (it used to be left out when the head fitted ZeRO-2's bucket)."""
    work = llama()
    head = 2 * work.model.vocab_size * work.model.hidden_size
    tiled, plain = estimate(work, config(stage)), estimate(work, config(stage, shards=1))
    assert tiled.details["tiled_loss_head_grad"] == head
    assert "tiled_loss_head_grad" not in plain.details
    forward = tiled.phases["forward"].gpu["gradients"] - plain.phases["forward"].gpu["gradients"]
    assert forward == head
    fits = estimate(work, config(2, reduce_bucket_size=2 * head))  # a bucket the head fits: still its own tensor
    assert fits.details["tiled_loss_head_grad"] == head


def test_a_frozen_head_has_no_gradient() -> None:
    """A LoRA model's head is frozen: nothing accumulates (its weight is the model's last parameter)."""
    from tuner.profile import params_profile
    from tuner.workload import preset_config

    base = params_profile(preset_config("tiny-llama"))
    n = len(base.param_numels)
    work = Workload(
        load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=1024)
    )
    for mask, frozen in (((True,) * (n - 1) + (False,), True), ((False,) + (True,) * (n - 1), False)):
        profile = ModelProfile(
            **{**base._static_fields(), "trainable": mask, "param_dtypes": ("bf16",) * n},
            activations=base.activations,
        )
        est = estimate(replace(work, profile=profile, trainable=TrainableSpec(freeze="x")), config(2, shards=4))
        assert ("tiled_loss_head_grad" in est.details) is not frozen


def test_zero2s_first_bucket_is_in_the_training_dtype_in_forward() -> None:
    """The head's gradient hook allocates the buckets in forward, in bf16 (``_gradient_reduction_buffer_dtype``);
    Ulysses' fp32 comes with the reduction, in backward."""
    work = llama()
    est = estimate(work, config(2, overlap_comm=True, reduce_bucket_size=10**7))
    assert est.details["reduce_buckets_forward"] == 2 * 2 * 10**7  # two buffers of bf16
    assert est.details["reduce_buckets"] == 2 * 4 * 10**7  # fp32 under Ulysses
    assert "reduce_buckets_forward" not in estimate(work, config(2, shards=1)).details


def test_zero3_holds_no_whole_parameter_at_the_losss_moment() -> None:
    """The loss's moment holds none of ZeRO-3's whole parameters; a layer's moment holds them but not the loss's
    workspace: the forward phase is the larger of the two, not their sum."""
    work = llama(8)
    plain, tiled = estimate(work, config(3, sp=8, shards=1)), estimate(work, config(3, sp=8))
    details = tiled.details
    whole = details["gathered_parameters"] + details["stage3_working_set"] + 2 * details["persistent_elements"]
    apart = details["tiled_loss_whole_parameters_apart"]
    assert 0 < apart <= whole
    assert "tiled_loss_whole_parameters_apart" not in plain.details
    forward, held = tiled.phases["forward"].gpu, plain.phases["forward"].gpu
    assert forward["parameters"] + forward["buffers"] + apart == (
        held["parameters"] + held["buffers"] - plain.details["logits_workspace"] + details["logits_workspace"]
    )
    # on ZeRO-2 every rank holds its whole 16-bit model: nothing is apart
    assert "tiled_loss_whole_parameters_apart" not in estimate(work, config(2, sp=8)).details
