"""Gradient accumulation: what a micro-step after a step's first holds beyond the first (pure arithmetic; the true
peaks are ``bench/results/sp_true_peak.md``'s accumulation rows and ``test_sp_true_peak.py``'s slow test)."""

from __future__ import annotations

import pytest

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

WORK = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=512))


def config(stage: int, accum: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 500_000},
    }


@pytest.mark.parametrize("accum", [2, 8])
def test_zero2_keeps_the_gradient_partition_through_the_next_micro_steps_forward(accum: int) -> None:
    """ZeRO-2's ``grads_in_partition`` holds what the earlier micro-steps reduced until the step: the forward phase
    of a later micro-step has the backward's gradient partition too, whatever the number of micro-steps."""
    one, more = estimate(WORK, config(2, 1)), estimate(WORK, config(2, accum))
    partition = one.phases["backward"].gpu["gradients"]
    assert partition > 0 and one.phases["forward"].gpu["gradients"] == 0
    assert more.phases["forward"].gpu["gradients"] == partition
    for phase in ("backward", "step"):
        assert more.phases[phase].gpu == one.phases[phase].gpu


@pytest.mark.parametrize("stage", [0, 1])
def test_zero0_and_1_keep_every_16_bit_gradient_through_the_next_micro_steps_forward(stage: int) -> None:
    """They reduce at the step only: a later micro-step's forward holds every 16-bit gradient (gpt2: 124M of them),
    the tiled loss's head gradient among them (not counted twice)."""
    n = WORK.model.n_params
    for tiled in ({}, {"dstune": {"tiled_loss_shards": 4}}):
        one, two = estimate(WORK, {**config(stage, 1), **tiled}), estimate(WORK, {**config(stage, 2), **tiled})
        assert two.phases["forward"].gpu["gradients"] == 2 * n
        assert one.phases["forward"].gpu["gradients"] == one.details.get("tiled_loss_head_grad", 0)
        for phase in ("backward", "step"):
            assert two.phases[phase].gpu == one.phases[phase].gpu
