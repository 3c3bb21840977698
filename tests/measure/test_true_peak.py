"""The true peak: the allocator's records of a real run, against its phase snapshots and against the estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from tuner.estimator import estimate
from tuner.measure.measurement import RankResult
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.space.dsconfig import merge_configs, shortcut_config
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

# Buckets sized for a 1M-parameter model, as a user would size them for a big one: the 2 GB fp32 default bucket
# would dominate every number and hide the transients.
BUCKETS = {"reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000, "stage3_prefetch_bucket_size": 100_000}
# Within a few % at stages 0-2. A tiny model's peak moves between runs of the same config by about one transient
# (a flattened copy, 0.8-3.8 MB here: timing on gloo; ZeRO-2's ranks read 15.7 and 16.5 MB in one run). ZeRO-3 was
# 25 % out while the profiler's records missed the all-gather buffers gloo frees on its own threads; counted at the
# allocator, both ranks read 20,118,813 bytes against 20,118,784 estimated.
TOLERANCE = {0: 0.06, 1: 0.06, 2: 0.06, 3: 0.03}


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
        assert rank.true_peak["source"] == "allocator" and rank.true_peak["profiled_steps"] == 2
        assert rank.true_peak["vm_hwm_bytes"] > 0
        forward = sum(v for k, v in rank.snapshots["forward"].items() if k != "other")
        assert true >= rank.model_state_bytes
        assert true >= forward + rank.activation_bytes
    peaks = [rank.true_peak_bytes for rank in run.ranks]
    # The estimate models the transients of one reduction; on gloo a rank sometimes still holds the previous flattened
    # copy when the next is made (timing-dependent: the same run reads one or two copies), so the closest rank is held
    # to the tolerance and no rank may read far below the estimate.
    assert min(abs(predicted / peak - 1) for peak in peaks) < TOLERANCE[stage], (predicted, peaks)
    assert predicted <= max(peaks) * (1 + TOLERANCE[stage]), (predicted, peaks)


# A Mixtral-shaped MoE of 17M parameters with a small vocabulary (its largest parameter is an expert stack of 2.4M
# elements), one reduce bucket for the whole model as with DeepSpeed's default buckets on the bench's 100M+ models.
# (With a bucket of twice the model the peak moved, run to run, to the step: fp32 gradients ``aten::_to_copy``
# beside a flattened 16-bit partition ``flatten_dense_tensors``, up to 10 % over the estimate; measured with the
# profiler's records, before the counting allocator.)
MOE = {
    "model_type": "mixtral",
    "vocab_size": 2000,
    "hidden_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 768,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


@pytest.mark.deepspeed
def test_zero3_estimate_tracks_the_worst_rank_true_peak(tmp_path: Path) -> None:
    """ZeRO-3 in bf16 on a Mixtral-shaped MoE (experts fused into one module, as transformers 5 builds them): fails
    if the weights are left uninitialised under zero.Init (non-finite gradients, every step skipped, Adam's moments
    never allocated: about +25 %) or if the estimate drops or double-counts the gathered parameters and the
    reduce-scatter staging. Both ranks read 354,913,829 bytes against 355,334,400 estimated (+0.12 %);
    the band was 6 % while the profiler's records missed the frees gloo makes on its own threads."""
    from tuner.profile import ProfileCache, model_from_config, with_profile

    cache = ProfileCache(tmp_path / "profiles")
    cluster = ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=2**34)
    train = TrainSpec(seq_len=64, precision="bf16")
    model = model_from_config(MOE, name="moe-17m", cache=cache)
    workload = with_profile(Workload(model, cluster, train), precisions=["bf16"], checkpointing=[False], cache=cache)
    buckets = {"reduce_bucket_size": 4 * model.n_params}
    config = merge_configs(shortcut_config(1, 1, "bf16", 3, "none", "none"), {"zero_optimization": buckets})
    run = run_measurement(workload, TrialConfig(config), MeasureOptions("local", warmup=2, steps=1, timeout=600))
    assert run.status == "ok", run.error
    worst = max(rank.true_peak_bytes or 0 for rank in run.ranks)
    predicted = estimate(workload, config).gpu_total
    assert abs(predicted / worst - 1) < 0.03, (predicted, [rank.true_peak_bytes for rank in run.ranks])


def test_nvml_bytes_are_found_in_a_container_where_nvml_lists_host_pids() -> None:
    """Inside a container NVML reports the host's PID for this rank: its bytes were lost (None). A rank holds its GPU
    alone, so the device's one process is the rank; with several and none ours, nothing is guessed."""
    from tuner.measure.rank.true_peak import own_process_bytes

    assert own_process_bytes([(2_345_678, 812 * 2**20)], 17) == 812 * 2**20
    assert own_process_bytes([(17, 5), (2_345_678, 9)], 17) == 5
    assert own_process_bytes([(2_345_678, 9), (2_345_679, 7)], 17) is None
