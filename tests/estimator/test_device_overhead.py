"""CUDA overhead as named terms: context by GPU generation, one NCCL term per communicator DeepSpeed opens (by stage,
world size, node count and group settings), cuBLAS workspaces, the simulated allocator reserve, attention kernels."""

from dataclasses import replace

import pytest

from tuner.estimator import Overhead, estimate
from tuner.estimator.runtime.device import KINDS, OTHER, device_kind
from tuner.estimator.runtime.nccl import Communicator, NcclCosts, communicator_bytes
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

MiB, GiB = 2**20, 2**30
HOPPER = NcclCosts(nvls=256 * MiB)
LARGER, PAIR = 688 * 10**6, 544 * 10**6
NET = 8 * (4 * MiB + 4_915_200)
PEER = (4_340 - 1_060) * 10**6 // 7


def config(stage: int = 3, **extra) -> dict:
    zero = {"stage": stage, **extra.pop("zero", {})}
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero, **extra}


def run(
    gpus: int,
    nodes: int = 1,
    gpu: str | None = "NVIDIA H100 80GB HBM3",
    ds_config: dict | None = None,
    activation_checkpointing: bool = False,
    **train,
):
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=gpus, nodes=nodes), TrainSpec(**train))
    trial = TrialConfig(ds_config or config(), activation_checkpointing)
    return estimate(work, trial, Overhead(device=device_kind(gpu)) if gpu else Overhead())


def names(world: int, stage: int = 0, **ds_config) -> list[tuple[str, int, int]]:
    """The communicators a trial's ranks open on ``world`` ranks, 8 a node (:meth:`TrialConfig.ranks`)."""
    zero = {"stage": stage, **ds_config.pop("zero", {})}
    ranks = TrialConfig({"zero_optimization": zero, **ds_config}).ranks(world, min(world, 8))
    return [(c.name, c.size, c.local) for c in ranks.communicators()]


def test_kinds_by_name_and_their_context() -> None:
    assert device_kind("NVIDIA H200").name == "H200" and device_kind("NVIDIA H100 80GB HBM3").name == "H100"
    assert device_kind("NVIDIA A100-SXM4-80GB").name == "A100" and device_kind(None) is OTHER
    # thread-stack reserve: SMs × 2048 resident threads × 1 KiB, plus 500 MiB of loaded modules
    assert KINDS["A100"].local_memory == 216 * MiB and KINDS["H200"].local_memory == 264 * MiB
    assert KINDS["B200"].context == 296 * MiB + 500 * MiB


def test_communicators_deepspeed_opens_per_setting() -> None:
    hpz, qgz = {"zero_hpz_partition_size": 8}, {"zero_quantized_gradients": True}
    assert names(1) == []
    assert names(8, stage=1) == [("world", 8, 8), ("data_parallel", 8, 8)]
    # hpZ only with ZeRO-3; groups of consecutive ranks
    assert ("hpz", 8, 8) in names(16, stage=3, zero=hpz)
    assert "hpz" not in {n for n, *_ in names(16, stage=2, zero=hpz)}
    # Ulysses: an all-to-all group, ZeRO's group of all ranks, a strided data-parallel group
    assert names(16, sequence_parallel_size=4) == [
        ("world", 16, 8),
        ("sequence_parallel", 4, 4),
        ("sequence_data_parallel", 16, 8),
        ("data_parallel", 4, 2),
    ]
    experts = names(16, expert_parallel={"enabled": True, "autoep_size": 8})
    assert ("expert_parallel", 8, 8) in experts and ("expert_data_parallel", 2, 1) in experts
    assert "quantized_all_to_all_local" not in {n for n, *_ in names(16, stage=2, zero=qgz)}
    qgz = names(16, stage=3, zero=qgz)
    assert ("quantized_all_to_all_local", 8, 8) in qgz and ("quantized_all_to_all_global", 2, 1) in qgz


def test_communicator_buffers_by_size_nodes_and_transport() -> None:
    assert communicator_bytes(Communicator("data_parallel", 2, 2), NcclCosts()) == PAIR
    assert communicator_bytes(Communicator("data_parallel", 4, 4), NcclCosts()) == LARGER
    assert communicator_bytes(Communicator("data_parallel", 8, 8), HOPPER) == LARGER + 256 * MiB  # NVLS
    assert communicator_bytes(Communicator("data_parallel", 2, 1), HOPPER) == PAIR + NET  # one GPU a node: no NVLS
    assert communicator_bytes(Communicator("data_parallel", 16, 8), HOPPER) == LARGER + 256 * MiB + NET
    # all-to-all: point-to-point buffers per peer, NVLink peers costing what nccl #1685 measured
    assert communicator_bytes(Communicator("sequence_parallel", 8, 8, True), HOPPER) == 7 * PEER
    assert communicator_bytes(Communicator("expert", 4, 2, True), HOPPER) == PEER + 2 * 16 * MiB
    assert communicator_bytes(Communicator("world", 1, 1), HOPPER) == 0


def test_eight_hoppers_name_every_term() -> None:
    est = run(8)
    terms = est.overhead_terms
    assert list(terms) == ["cuda_context", "nccl_world", "nccl_data_parallel", "cublas_workspace", "allocator_reserve"]
    assert terms["cuda_context"] == 264 * MiB + 500 * MiB
    assert terms["nccl_world"] == terms["nccl_data_parallel"] == LARGER + 256 * MiB
    assert terms["cublas_workspace"] == 2 * 32 * MiB  # forward and backward threads' handles
    reserve = est.details["simulated_peak_reserved"] - est.details["simulated_peak_allocated"]
    assert terms["allocator_reserve"] == reserve > 0
    assert est.per_gpu["overhead"] == sum(terms.values())
    assert est.details["nccl_buffers"] == 2 * (LARGER + 256 * MiB)
    assert est.to_dict()["overhead_terms"] == terms
    fixed = est.per_gpu["overhead"] - terms["allocator_reserve"]
    assert 2 * GiB <= fixed <= 3 * GiB  # 2-3 GiB beyond tensors: the usual figure for an 8-GPU H100 rank


def test_nodes_and_group_settings_add_their_communicators() -> None:
    two_nodes = run(8, nodes=2).overhead_terms
    assert two_nodes["nccl_data_parallel"] == LARGER + 256 * MiB + NET
    pair = run(1, nodes=2, gpu="NVIDIA A100-SXM4-80GB").overhead_terms
    assert pair["nccl_world"] == PAIR + NET and pair["cublas_workspace"] == 2 * 8320 * 1024
    assert "nccl_world" not in run(1, gpu="NVIDIA A100-SXM4-80GB").overhead_terms
    hpz = run(8, nodes=2, ds_config=config(zero={"zero_hpz_partition_size": 8})).overhead_terms
    assert hpz["nccl_hpz"] == LARGER + 256 * MiB
    ulysses = run(8, ds_config=config(sequence_parallel_size=4)).overhead_terms
    assert ulysses["nccl_sequence_parallel"] == 3 * PEER and ulysses["nccl_data_parallel"] == PAIR + 256 * MiB


def test_the_default_overhead_guesses_the_kind_from_gpu_memory() -> None:
    default = run(8, gpu=None)  # 80 GiB: an H100
    assert default.overhead_terms["cuda_context"] == KINDS["H100"].context
    assert default.overhead_terms == run(8).overhead_terms


def test_calibrated_values_replace_the_defaults() -> None:
    measured = Overhead(device=replace(KINDS["H100"], modules=900 * MiB, allocator_share=0.1))
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8))
    est = estimate(work, config(), measured)
    assert est.overhead_terms["cuda_context"] == 264 * MiB + 900 * MiB
    tensors = est.gpu_total - int(est.per_gpu["overhead"] or 0)
    assert est.overhead_terms["allocator_reserve"] == int(0.1 * tensors)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_expandable_segments_reserve_less(stage: int) -> None:
    work = Workload(
        load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=2, gpu_memory=512 * GiB), TrainSpec(2048)
    )
    h200 = Overhead(device=device_kind("NVIDIA H200"))
    plain = estimate(work, config(stage), h200)
    grown = estimate(work, config(stage, dstune={"expandable_segments": True}), h200)
    # what the simulated allocator holds from the device at the step's peak (the reserve term is that less the
    # peak of allocated bytes, which expandable segments also round differently)
    assert grown.details["simulated_peak_reserved"] < plain.details["simulated_peak_reserved"]
    assert grown.overhead_terms["allocator_reserve"] >= 0


def test_a_config_that_cannot_fit_is_not_simulated() -> None:
    est = run(1, ds_config=config(0))  # 7B at ZeRO-0 on one 80 GiB GPU: 16 B/param alone is 108 GB
    tensors = est.gpu_total - int(est.per_gpu["overhead"] or 0)
    assert est.details["allocator_out_of_memory"] == 1 and "simulated_peak_reserved" not in est.details
    assert est.overhead_terms["allocator_reserve"] == int(0.07 * tensors) and not est.fits


def test_attention_kernels_add_their_padded_log_sum_exp_on_cuda_only() -> None:
    fp32 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    padded = run(8, ds_config=fp32, seq_len=1000)  # memory-efficient kernel: 1000 -> 1024 positions
    assert padded.details["attention_kernel_extra"] == 32 * (4 * 32 * 24 + 1024)
    flash = run(8, seq_len=1024)  # bf16: flash, only the RNG state's two blocks per layer
    assert flash.details["attention_kernel_extra"] == 32 * 1024
    checkpointed = run(8, seq_len=1024, activation_checkpointing=True)  # only the recomputed block
    assert checkpointed.details["attention_kernel_extra"] == 1024
    work = Workload(
        load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8, device="cpu"), TrainSpec(seq_len=1000)
    )
    assert "attention_kernel_extra" not in estimate(work, fp32).details
