"""What ZeRO-3 keeps gathered after the forward pass (pure arithmetic; the true peak it sets is checked against a
real DeepSpeed run in test_precision_true_peak.py): DeepSpeed 0.19.8 releases by ``stage3_max_reuse_distance``
alone, ``stage3_max_live_parameters`` bounds its prefetch only."""

from __future__ import annotations

from typing import Any

from bench_module import load_bench

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, model_from_hf_config

LLAMA = load_bench("precision_true_peak").LLAMA  # a 1,048,576-element embedding and LM head, untied


def details(**zero: Any) -> dict[str, int]:
    work = Workload(model_from_hf_config(LLAMA, "llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec())
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, **zero}}
    return estimate(work, TrialConfig(config)).details


def test_max_live_parameters_does_not_cap_what_forward_keeps() -> None:
    """Measured on 2 CPU ranks (``bench/results/precision_true_peak.md``, ``stage3_max_live_parameters`` 500,000):
    every non-persistent parameter, 4,456,448 elements in bf16, is gathered at the loss's backward; the estimate
    kept only the largest (the LM head's 1,048,576) and was 5.5 MiB (7-9 %) under at every ZeRO-3 row."""
    small = details(stage3_max_live_parameters=500_000, stage3_prefetch_bucket_size=500_000)
    default = details()
    assert small["gathered_parameters"] == default["gathered_parameters"] == 2 * 4_456_448
    assert small["stage3_working_set"] == 0  # nothing left to gather beyond what is kept


def test_forward_keeps_what_backward_reuses_within_the_reuse_distance() -> None:
    """``stage3_max_reuse_distance`` 3,000,000, below twice the model's 5.2M elements: the parameters whose forward
    and backward uses lie fewer elements apart (twice those after them) stay gathered, 1,638,400 elements (the LM
    head and the last layer's MLP); the estimate's peak is within 0.01 % of the counting allocator's
    (``bench/results/precision_true_peak.md``, ``reuse3000000``: 54.68 MiB both)."""
    assert details(stage3_max_reuse_distance=3_000_000)["gathered_parameters"] == 2 * 1_638_400


def test_a_reuse_distance_below_the_largest_parameter_keeps_nothing() -> None:
    """``stage3_max_reuse_distance`` 0: each module's parameters are released after use, whatever max-live says."""
    kept = details(stage3_max_live_parameters=1_000_000_000, stage3_max_reuse_distance=0)
    assert kept["gathered_parameters"] == 0
