"""CUDA overhead terms per device kind: context, NCCL buffers per communicator, cuBLAS workspace, allocator reserve."""

from dataclasses import replace

import pytest

from tuner.estimator import Overhead, estimate
from tuner.estimator.device import HOPPER, OTHER, device_kind
from tuner.workload import ClusterSpec, Workload, load_model

MiB, GiB = 2**20, 2**30
CONFIG = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}


def run(gpus: int, nodes: int = 1, overhead: Overhead | None = None):
    work = Workload(load_model("llama-2-7b"), ClusterSpec(gpus_per_node=gpus, nodes=nodes))
    return estimate(work, CONFIG, overhead or Overhead())


def test_kinds_by_name() -> None:
    assert device_kind("NVIDIA H200") is HOPPER and device_kind("NVIDIA H100 80GB HBM3") is HOPPER
    assert device_kind("NVIDIA A100-SXM4-80GB") is OTHER and device_kind(None) is OTHER


def test_eight_hoppers_cost_two_to_three_gib_plus_the_reserve() -> None:
    """FIELD_NOTES' starting formula for an 8-GPU H100 data-parallel rank: roughly 2-3 GiB + 5-10 % of the peak."""
    est = run(8, overhead=Overhead.for_gpu("NVIDIA H100 80GB HBM3"))
    details = est.details
    assert details["cuda_context"] == 768 * MiB
    assert details["nccl_buffers"] == 2 * (688 * 10**6 + 256 * MiB)  # world group + DeepSpeed's data-parallel clone
    assert details["cublas_workspace"] == 32 * MiB
    tensors = est.per_gpu["total"] - est.per_gpu["overhead"]
    assert details["allocator_reserve"] == int(0.07 * tensors)
    fixed = est.per_gpu["overhead"] - details["allocator_reserve"]
    assert 2 * GiB <= fixed <= 3 * GiB


def test_one_rank_opens_no_communicator_and_pairs_cost_less() -> None:
    alone = run(1, overhead=Overhead.for_gpu("NVIDIA A100-SXM4-80GB")).details
    assert alone["nccl_buffers"] == 0 and alone["cublas_workspace"] == 8320 * 1024
    pair = run(1, nodes=2, overhead=Overhead.for_gpu("NVIDIA A100-SXM4-80GB")).details
    assert pair["nccl_buffers"] == 2 * 544 * 10**6  # one GPU per node: no NVLS, a 2-rank communicator
    hopper_pair = run(1, nodes=2, overhead=Overhead.for_gpu("NVIDIA H200")).details
    assert hopper_pair["nccl_buffers"] == 2 * 544 * 10**6  # NVLS needs several GPUs on a node


def test_calibrated_context_and_the_default_model() -> None:
    measured = Overhead(device=replace(HOPPER, context=1100 * MiB))
    assert run(8, overhead=measured).details["cuda_context"] == 1100 * MiB
    default = run(8)
    tensors = default.per_gpu["total"] - default.per_gpu["overhead"]
    assert default.per_gpu["overhead"] == 512 * MiB + int(0.05 * tensors)  # no device kind: the two-term default
    assert "nccl_buffers" not in default.details


@pytest.mark.parametrize("gpus", [1, 8])
def test_cpu_runs_have_no_device_overhead(gpus: int) -> None:
    work = Workload(load_model("tiny-llama"), ClusterSpec(gpus_per_node=gpus, device="cpu"))
    assert estimate(work, CONFIG, Overhead.for_gpu("NVIDIA H200")).per_gpu["overhead"] == 0
