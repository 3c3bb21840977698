"""The throughput model: FLOPs against a hand count, ZeRO communication volumes, offload, overlap and factors."""

import pytest

from tuner.estimator.throughput.hardware import TABLE, table_key
from tuner.estimator.throughput.prediction import RECOMPUTE, predict
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model, model_from_param_count

GIB = 2**30


def config(stage: int, micro: int = 1, accum: int = 1, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
    }


def test_compute_term_is_the_hand_counted_flops_of_gpt2_over_the_sustained_rate() -> None:
    """GPT-2 small: Ψ = 124,439,808; per token 6Ψ + 12·L·h·s = 746,638,848 + 12·12·768·1024 = 859,885,056 FLOPs."""
    work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=1), TrainSpec(seq_len=1024))
    hand = 6 * 124_439_808 + 12 * 12 * 768 * 1024
    assert hand == 859_885_056
    tokens = 4 * 2 * 1024  # micro-batch 4, 2 accumulation steps
    p = predict(work, config(0, micro=4, accum=2))
    assert p.hardware == "H100"
    assert p.terms.compute == pytest.approx(hand * tokens / TABLE["H100"].flops, rel=1e-12)
    checkpointed = predict(work, TrialConfig(config(0, 4, 2), activation_checkpointing=True))
    assert checkpointed.terms.compute == pytest.approx(p.terms.compute * RECOMPUTE, rel=1e-12)
    assert pytest.approx(4 / 3) == RECOMPUTE


def test_tokens_per_s_is_the_global_batch_over_the_step_time() -> None:
    work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=512))
    p = predict(work, config(2, micro=8, accum=4))
    assert p.tokens_per_s == pytest.approx(8 * 4 * 8 * 512 / p.step_time_s)
    assert p.samples_per_s == pytest.approx(8 * 4 * 8 / p.step_time_s)
    assert 0 < p.mfu < 0.5  # at most the table's sustained share of peak


def test_zero3_is_predicted_slower_than_zero0_on_one_cpu_rank() -> None:
    """One CPU rank sends nothing, but ZeRO-3's per-parameter fetch hooks run every pass (measured: 3-5× slower)."""
    work = Workload(
        load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(seq_len=128)
    )
    zero0, zero3 = predict(work, config(0, micro=2, accum=8)), predict(work, config(3, micro=2, accum=8))
    assert zero0.terms.bandwidth == zero3.terms.bandwidth == 0
    assert zero3.tokens_per_s < zero0.tokens_per_s / 2
    assert zero3.bound == "latency" and zero0.bound == "compute"


def test_gradient_all_reduce_volume_on_eight_gpus() -> None:
    """ZeRO-0 all-reduces 2·(N-1)/N of the 16-bit gradients once per step; ZeRO-2 sends the same bytes per step at
    accumulation 1 (reduce-scatter + all-gather) and one more reduce-scatter per extra micro-step; ZeRO-3 adds the
    parameter gathers of forward and backward."""
    model = load_builtin_model("llama-2-7b")
    work = Workload(model, ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=2048))
    link = TABLE["H100"].intra_bw
    ring = 7 / 8
    grads = 2 * model.n_params
    assert predict(work, config(0)).terms.bandwidth == pytest.approx(2 * ring * grads / link)
    assert predict(work, config(2)).terms.bandwidth == pytest.approx(2 * ring * grads / link)
    assert predict(work, config(2, accum=4)).terms.bandwidth == pytest.approx(5 * ring * grads / link)
    threshold = {"stage3_param_persistence_threshold": 0}
    assert predict(work, config(3, **threshold)).terms.bandwidth == pytest.approx(3 * ring * grads / link)


def test_several_nodes_communicate_over_the_slower_network() -> None:
    model = load_builtin_model("llama-2-7b")
    one = Workload(model, ClusterSpec(gpus_per_node=8, nodes=1), TrainSpec(seq_len=2048))
    two = Workload(model, ClusterSpec(gpus_per_node=4, nodes=2), TrainSpec(seq_len=2048))
    slow, fast = predict(two, config(3)), predict(one, config(3))
    assert slow.terms.bandwidth == pytest.approx(fast.terms.bandwidth * TABLE["H100"].intra_bw / TABLE["H100"].inter_bw)
    assert slow.tokens_per_s < fast.tokens_per_s


def test_hpz_gathers_within_the_node_after_the_first_forward_of_a_step() -> None:
    """ZeRO++ hpZ (arXiv 2306.10209): the first forward after a step gathers over all 16 ranks across the nodes,
    every later gather (backward, the second micro-step's forward and backward) over the 8 ranks of a node; the
    gradients' reduce-scatter still crosses the nodes. On one node of 8 a group of 8 is the whole world: no change."""
    model = load_builtin_model("llama-2-7b")
    two = Workload(model, ClusterSpec(gpus_per_node=8, nodes=2), TrainSpec(seq_len=2048))
    hw, elem = TABLE["H100"], 2 * model.n_params
    plain = {"stage3_param_persistence_threshold": 0, "overlap_comm": False}
    across = 15 / 16 * elem / hw.inter_bw
    assert predict(two, config(3, accum=2, **plain)).terms.bandwidth == pytest.approx(2 * 3 * across)
    hpz = predict(two, config(3, accum=2, zero_hpz_partition_size=8, **plain))
    assert hpz.terms.bandwidth == pytest.approx(2 * across + across + 3 * 7 / 8 * elem / hw.intra_bw)
    assert hpz.tokens_per_s > predict(two, config(3, accum=2, **plain)).tokens_per_s
    one = Workload(model, ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=2048))
    alone = predict(one, config(3, accum=2, zero_hpz_partition_size=8, **plain)).terms.bandwidth
    assert alone == pytest.approx(predict(one, config(3, accum=2, **plain)).terms.bandwidth)


def test_overlap_comm_hides_gradient_reduction_behind_backward() -> None:
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=4, nodes=2), TrainSpec(seq_len=2048))
    plain = predict(work, config(2, micro=2, accum=4, overlap_comm=False))
    overlapped = predict(work, config(2, micro=2, accum=4, overlap_comm=True))
    assert overlapped.terms.bandwidth == plain.terms.bandwidth
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.step_time_s >= plain.step_time_s - plain.terms.bandwidth


def test_optimizer_offload_costs_host_time() -> None:
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=2048))
    offload = {"offload_optimizer": {"device": "cpu"}}
    on_gpu, on_host = predict(work, config(2, micro=1, accum=1)), predict(work, config(2, 1, 1, **offload))
    assert on_host.terms.memory > 10 * on_gpu.terms.memory
    assert on_host.tokens_per_s < on_gpu.tokens_per_s


def test_factors_scale_their_term() -> None:
    work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(seq_len=256))
    table = predict(work, config(0, micro=4, accum=2))
    slower = predict(work, config(0, micro=4, accum=2), factors={"compute": 2.0})
    assert slower.step_time_s == pytest.approx(table.step_time_s + table.terms.compute)
    assert slower.to_dict()["terms_s"]["compute"] == pytest.approx(2 * table.terms.compute)
    assert slower.to_dict()["fitted"] and not table.to_dict()["fitted"]


def test_fp32_and_bare_models_and_device_kinds() -> None:
    work = Workload(
        load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=1, gpu_memory=80 * GIB), TrainSpec(seq_len=512)
    )
    fp32 = {**config(0), "bf16": {"enabled": False}}
    # PyTorch leaves TF32 off: fp32 matmuls run on the CUDA cores, 67 against 989 dense bf16 TFLOP/s on H100
    assert predict(work, fp32).terms.compute == pytest.approx(predict(work, config(0)).terms.compute * 989 / 67)
    bare = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=2048))
    assert predict(bare, config(3)).terms.compute == pytest.approx(6e9 * 2048 / TABLE["H100"].flops)
    assert table_key(work, "NVIDIA H200") == "H200"
    assert table_key(Workload(work.model, ClusterSpec(gpu_memory=40 * GIB))) == "A100"
    assert table_key(Workload(work.model, ClusterSpec(gpu_memory=141 * 10**9))) == "H200"
