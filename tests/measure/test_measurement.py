"""Aggregation of rank results into a job's measurement (pure logic)."""

import pytest

from tuner.estimator import model_flops_per_token, peak_tflops
from tuner.measure.measurement import PEER_KILLED, RankResult, aggregate, percentile
from tuner.workload import load_builtin_model


def test_percentiles_interpolate() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9) == pytest.approx(9.1)


def test_throughput_uses_the_slowest_rank_per_step() -> None:
    spec = load_builtin_model("tiny-gpt2")
    ranks = [RankResult(0, "ok", step_times=[1.0, 1.0, 1.0]), RankResult(1, "ok", step_times=[2.0, 2.0, 1.0])]
    result = aggregate(ranks, spec, seq_len=64, samples_per_step=8, world_size=2)
    assert result.status == "ok"
    assert result.step_time_s["p50"] == 2.0
    assert result.samples_per_s == 4.0 and result.tokens_per_s == 256.0
    flops = model_flops_per_token(spec, 64) * 8 * 64 / 2 / 2.0 / 1e12
    assert result.tflops_per_device == pytest.approx(flops)
    assert result.mfu is None


def test_root_cause_wins_over_peers_killed_after_it() -> None:
    spec = load_builtin_model("tiny-gpt2")
    ranks = [
        RankResult(0, "error", exception_type=PEER_KILLED, error="killed after another rank failed"),
        RankResult(1, "oom", exception_type="torch.OutOfMemoryError", error="CUDA out of memory"),
    ]
    result = aggregate(ranks, spec, 64, 8, 2)
    assert result.status == "oom" and result.exception_type == "torch.OutOfMemoryError"


def test_mfu_for_known_gpus() -> None:
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("cpu") is None


def test_progress_lines_are_read_complete_only(tmp_path) -> None:
    from tuner.measure.run_protocol import progress_path, read_progress

    assert read_progress(tmp_path, 0) == []
    progress_path(tmp_path, 0).write_text("0.5\n0.25\n0.1")  # the third step's line is still being written
    assert read_progress(tmp_path, 0) == [0.5, 0.25]


def test_a_stopped_rank_counts_as_ok_and_the_split_takes_the_slowest_rank() -> None:
    from tuner.measure.measurement import STOPPED_EARLY

    ranks = [
        RankResult(0, "ok", exception_type=STOPPED_EARLY, step_times=[1.0, 2.0], breakdown={"forward_s": 0.5}),
        RankResult(1, "ok", exception_type=STOPPED_EARLY, step_times=[1.5], breakdown={"forward_s": 0.25}),
    ]
    measurement = aggregate(ranks, load_builtin_model("tiny-gpt2"), 64, 8, 2)
    assert measurement.status == "ok" and measurement.step_time_s["p50"] == 1.5  # one step both ranks finished
    assert measurement.breakdown == {"forward_s": 0.5}
    measurement.set_wall(10.0)
    assert measurement.cost == {"wall_s": 10.0, "overhead_s": 10.0, "other_s": 10.0}


def test_model_flops_count_weight_gradients_of_the_parameters_that_trained() -> None:
    spec = load_builtin_model("tiny-gpt2")
    ranks = [RankResult(rank=r, status="ok", step_times=[1.0], trainable_params=1000) for r in range(2)]
    lora = aggregate(ranks, spec, seq_len=64, samples_per_step=8, world_size=2)
    full = aggregate([RankResult(rank=r, status="ok", step_times=[1.0]) for r in range(2)], spec, 64, 8, 2)
    assert full.tflops_per_device == pytest.approx(model_flops_per_token(spec, 64) * 8 * 64 / 2 / 1e12)
    assert lora.tflops_per_device == pytest.approx(model_flops_per_token(spec, 64, 1000) * 8 * 64 / 2 / 1e12)
    assert lora.tflops_per_device < full.tflops_per_device
