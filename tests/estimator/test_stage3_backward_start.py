"""ZeRO-3's start of backward, where every parameter forward kept gathered is still whole (pure arithmetic; the
moments were found, and the estimate checked, against the counting allocator on 2 CPU ranks:
``bench/results/precision_true_peak.md``, the seq-32 ZeRO-3 rows)."""

from __future__ import annotations

from typing import Any

from bench_module import load_bench

from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, model_from_hf_config

BENCH = load_bench("precision_true_peak")
LLAMA = BENCH.LLAMA  # hidden 256, vocabulary 4,096: a 1,048,576-element LM head, untied
SEQ, ELEM = 32, 2
HEAD = 4096 * 256


def estimated(seq: int = SEQ, offload: bool = False, **zero: Any) -> Any:
    case = {"stage": 3, "offload": offload, "precision": "bf16-master+states", "world": 2}
    config = BENCH.ds_config(case)
    config["zero_optimization"].update(zero)
    work = Workload(model_from_hf_config(LLAMA, "llama"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq))
    return estimate(work, TrialConfig(config))


def test_the_lm_heads_backward_holds_every_kept_parameter_and_the_heads_gradients() -> None:
    """At seq 32 the peak is inside the LM head's backward (41,763,805 bytes measured; the estimate was 2.1 % under,
    its backward phase holding no gathered parameter): every parameter forward kept gathered, the saved activations
    less the loss's fp32 log-softmax, the logits' gradient and the head's weight and input gradients, in bf16."""
    est = estimated()
    d = est.details
    saved = est.phases["forward"].gpu["activations"]
    tokens = SEQ
    moment = d["gathered_parameters"] + saved - 4 * tokens * 4096 + ELEM * (tokens * 4096 + HEAD + tokens * 256)
    assert d["gathered_parameters"] == 2 * 4_456_448
    assert d["stage3_backward_start"] == moment - d["reduce_copy"]
    assert est.peak_phase == "backward"


def test_offload_adds_the_norms_fp64_copy_at_the_first_reduction() -> None:
    """With optimizer offload the first reduction (the LM head alone: larger than the 500,000-element bucket) comes
    after the head's module is released; ``_constant_buffered_norm2`` converts the head's gradient partition
    (524,288 elements on each of 2 ranks) to fp64 beside the head's gradient (59,214,941 bytes measured; the
    estimate was 4.4 % under)."""
    est = estimated(offload=True)
    d = est.details
    saved = est.phases["forward"].gpu["activations"]
    kept_after = d["gathered_parameters"] - ELEM * HEAD
    moment = kept_after + saved - 4 * SEQ * 4096 + ELEM * HEAD + 8 * (HEAD // 2)
    assert d["stage3_backward_start"] == moment - d["reduce_copy"]


def test_nothing_kept_gathered_adds_nothing() -> None:
    """A reuse distance of 0 releases each module's parameters after use: backward starts with none gathered."""
    assert "stage3_backward_start" not in estimated(stage3_max_reuse_distance=0).details


def test_the_loss_moment_still_sets_the_peak_at_long_sequences() -> None:
    """At seq 256 the loss's fp32 workspace outweighs the head's gradients: the peak stays in forward (within 0.01 %
    of the counting allocator at every ZeRO-3 row of the table)."""
    est = estimated(seq=256)
    assert est.peak_phase == "forward"
    assert est.phases["backward"].gpu_total < est.phases["forward"].gpu_total
