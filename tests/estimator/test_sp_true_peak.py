"""The estimate under Ulysses against the true peak of a real DeepSpeed run (slow): 2 gloo CPU ranks at sp = 2,
ZeRO-3, bf16, a tiny Qwen2 at seq 1024, trained by ``bench/sp_true_peak.py``'s ranks (DeepSpeed's
``UlyssesSPAttentionHF`` registered with transformers, the batch split along the sequence). Truth: the counting
allocator's peak of live CPU tensor bytes (every thread), not the estimator's own arithmetic."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from bench_module import load_bench

CASE = {"model": "qwen2", "stage": 3, "world": 2, "sp": 2, "mlp": 1, "loss": 1}


@pytest.fixture(scope="module")
def measured() -> tuple[ModuleType, dict[str, Any]]:
    bench = load_bench("sp_true_peak")
    return bench, bench.measure(CASE, timeout=1800)


@pytest.mark.slow
def test_sp_estimate_is_within_3_percent_of_the_true_peak(measured: tuple[ModuleType, dict[str, Any]]) -> None:
    bench, data = measured
    assert data["status"] == "ok", data["error"]
    peaks = [rank["peak_bytes"] for rank in data["ranks"]]
    assert peaks[0] == peaks[1]  # the two sequence halves hold the same bytes
    est = bench.estimate_case(CASE)
    assert est.per_gpu["total"] == pytest.approx(max(peaks), rel=0.03)
    # the same step on one rank's whole sequence would hold far more: the estimate does not pass by accident
    plain = bench.estimate_case({**CASE, "sp": 1})
    assert plain.per_gpu["activations"] > 1.5 * est.per_gpu["activations"]


LONG = {"model": "qwen2", "stage": 0, "world": 2, "sp": 2, "mlp": 4, "loss": 16, "ckpt": True, "seq": 8192}


@pytest.mark.slow
def test_a_long_checkpointed_sequence_peaks_in_a_recomputed_layers_backward() -> None:
    """ALST's way at 8,192 tokens (checkpointing, tiled MLP and loss): the peak is the recomputed layer part-way
    through its backward (RMSNorm's fp32 gradient temporaries beside attention's saved tensors), which the traced
    backward moment counts; counting the layer's saved bytes alone was 12 % under."""
    bench = load_bench("sp_true_peak")
    data = bench.measure(LONG, timeout=1800)
    assert data["status"] == "ok", data["error"]
    est = bench.estimate_case(LONG)
    assert est.details["recomputed_backward_peak"] > est.details["tiled_mlp_shard"]
    assert est.per_gpu["total"] == pytest.approx(max(rank["peak_bytes"] for rank in data["ranks"]), rel=0.03)


TILED_MOE = {"model": "qwen2-moe", "stage": 3, "world": 2, "sp": 2, "mlp": 4, "loss": 4}


@pytest.mark.slow
def test_a_tiled_moe_peaks_at_the_tiled_losss_moment() -> None:
    """ALST's tiled MLP and loss on an MoE under ZeRO-3: the peak is inside a tiled-loss shard's backward (three fp32
    shard tensors, the head's accumulated gradient, no whole parameter) over what the MoE blocks saved beyond their
    tiled MLPs (traced). Counting the formula's MoE intermediates and the parameters at the loss was 4.5 % over."""
    bench = load_bench("sp_true_peak")
    data = bench.measure(TILED_MOE, timeout=1800)
    assert data["status"] == "ok", data["error"]
    est = bench.estimate_case(TILED_MOE)
    assert est.details["tiled_loss_whole_parameters_apart"] > 0 and est.details["tiled_loss_head_grad"] > 0
    assert est.per_gpu["total"] == pytest.approx(max(rank["peak_bytes"] for rank in data["ranks"]), rel=0.015)


ACCUMULATING = {"model": "qwen2", "stage": 2, "world": 2, "sp": 2, "mlp": 4, "loss": 4, "accum": 2}


@pytest.mark.slow
def test_a_later_micro_step_holds_the_gradients_the_earlier_ones_reduced() -> None:
    """Gradient accumulation under Ulysses and ALST's tiling, ZeRO-2: the peak is in the second micro-step's forward
    (the tiled loss's moment), with the gradient partition the first micro-step reduced still held. Without it the
    estimate was 5.9 % under (22.68 against 24.10 MiB)."""
    bench = load_bench("sp_true_peak")
    data = bench.measure(ACCUMULATING, timeout=1800)
    assert data["status"] == "ok", data["error"]
    worst = max(data["ranks"], key=lambda rank: rank["peak_bytes"])
    assert worst["peak_during"].endswith("micro 1 forward")
    est = bench.estimate_case(ACCUMULATING)
    assert est.peak_phase == "forward"
    assert est.per_gpu["total"] == pytest.approx(worst["peak_bytes"], rel=0.01)
