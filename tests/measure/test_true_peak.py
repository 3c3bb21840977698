"""The true peak: the allocator's records of a real run, against its phase snapshots and against the estimate."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

from tuner.dsconfig import merge_configs, shortcut_config
from tuner.estimator import estimate
from tuner.measure.measurement import RankResult
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.trial import TrialConfig
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

# Buckets sized for a 1M-parameter model, as a user would size them for a big one: the 2 GB fp32 default bucket
# would dominate every number and hide the transients.
BUCKETS = {"reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000, "stage3_prefetch_bucket_size": 100_000}
# Within a few % at stages 0-2. A tiny model's peak moves between runs of the same config by about one transient
# (a flattened copy, 0.8-3.8 MB here: timing on gloo). ZeRO-3's early-backward moment on a tiny model (all
# activations, the logits' gradients, every weight gathered, reduce-scatter staging) is under-estimated: measured
# 21.8-27.8 MB over six runs of this config against 20.1 MB estimated (Pythia-160M shape: within 1.3 %), a known gap.
TOLERANCE = {0: 0.06, 1: 0.06, 2: 0.06, 3: 0.25}


def test_peak_bytes_is_the_true_peak_when_measured() -> None:
    snapshot_only = RankResult(rank=0, status="ok", model_state_bytes=100, activation_bytes=20)
    measured = RankResult(rank=0, status="ok", model_state_bytes=100, activation_bytes=20, true_peak_bytes=150)
    assert snapshot_only.peak_bytes == 120
    assert measured.peak_bytes == 150
    assert RankResult.from_dict(measured.to_dict()).true_peak_bytes == 150


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_true_peak_covers_the_snapshots_and_the_estimate_matches_it(stage: int) -> None:
    workload = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=2**34),
        TrainSpec(seq_len=64, precision="fp32"),
    )
    config = merge_configs(
        shortcut_config(2, 1, "fp32", stage, "none", "none"),
        {"zero_optimization": BUCKETS, "optimizer": {"params": {"torch_adam": True}}},
    )
    run = run_measurement(workload, TrialConfig(config), MeasureOptions("local", warmup=2, steps=1, timeout=600))
    assert run.status == "ok", run.error
    predicted = estimate(workload, config).per_gpu["total"]
    for rank in run.ranks:
        true = rank.true_peak_bytes
        assert true is not None and rank.peak_bytes == true
        assert rank.true_peak["source"] == "profiler" and rank.true_peak["profiled_steps"] == 2
        assert rank.true_peak["vm_hwm_bytes"] > 0 and rank.true_peak["memory_events"] > 0
        forward = sum(v for k, v in rank.snapshots["forward"].items() if k != "other")
        assert true >= rank.model_state_bytes
        assert true >= forward + rank.activation_bytes
    peaks = [rank.true_peak_bytes for rank in run.ranks]
    # The estimate models the transients of one reduction; on gloo a rank sometimes still holds the previous flattened
    # copy when the next is made (timing-dependent: the same run reads one or two copies), so the closest rank is held
    # to the tolerance and no rank may read far below the estimate.
    assert min(abs(predicted / peak - 1) for peak in peaks) < TOLERANCE[stage], (predicted, peaks)
    assert predicted <= max(peaks) * (1 + TOLERANCE[stage]), (predicted, peaks)
