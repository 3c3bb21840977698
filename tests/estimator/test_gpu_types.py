"""A cluster's GPU type sets the estimate's device terms and throughput table: the usable memory (the type's, when
no --gpu-memory is given), the CUDA context's thread-stack reserve (SMs × resident threads × 1 KiB), the cuBLAS
workspaces (32 MiB on sm90, 8,320 KiB elsewhere), and the datasheet rates the throughput model starts from."""

from __future__ import annotations

import pytest

from tuner.estimator import estimate, predict
from tuner.estimator.throughput.hardware import hardware_for, table_key
from tuner.requests import WorkloadRequest, to_workload
from tuner.workload import GPU_TYPES, ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

MiB, GiB = 2**20, 2**30
TRIAL = TrialConfig({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}})


def typed(gpu: str, gpus: int = 8) -> Workload:
    cluster = ClusterSpec(gpus_per_node=gpus, gpu_memory=GPU_TYPES[gpu].usable_memory, gpu_type=gpu)
    return Workload(load_builtin_model("gpt2-medium"), cluster, TrainSpec(seq_len=1024, precision="fp16"))


@pytest.mark.parametrize(
    ("gpu", "stack_mib", "workspace"),
    [
        ("a100-40gb", 216, 8320 * 1024),
        ("h100-80gb", 264, 32 * MiB),
        ("h200", 264, 32 * MiB),
        ("l40s", 213, 8320 * 1024),
        ("rtx-3090", 123, 8320 * 1024),
        ("rtx-4090", 192, 8320 * 1024),
        ("v100-32gb", 160, 8320 * 1024),
    ],
)
def test_the_type_sets_the_context_and_workspace_terms(gpu: str, stack_mib: int, workspace: int) -> None:
    terms = estimate(typed(gpu), TRIAL).overhead_terms
    assert terms["cuda_context"] == stack_mib * MiB + 500 * MiB
    assert terms["cublas_workspace"] == 2 * workspace  # the forward's and autograd's backward thread's


def test_the_type_sets_the_throughput_table() -> None:
    for gpu in GPU_TYPES:
        work = typed(gpu)
        assert table_key(work) == gpu and hardware_for(work).memory_bw == GPU_TYPES[gpu].memory_bw
    fast, slow = predict(typed("h200"), TRIAL), predict(typed("rtx-3090"), TRIAL)
    assert (fast.hardware, slow.hardware) == ("h200", "rtx-3090")
    assert fast.tokens_per_s > 3 * slow.tokens_per_s
    # a measured device's name still wins over the cluster's type
    assert table_key(typed("rtx-4090"), "NVIDIA H100 80GB HBM3") == "H100"
    assert table_key(typed("h200"), "NVIDIA GeForce RTX 4090") == "rtx-4090"


def test_a_typed_request_gets_the_types_usable_memory_unless_given() -> None:
    request = WorkloadRequest(model="gpt2", model_impl="builtin", gpu_type="rtx-4090", precision="fp16")
    assert to_workload(request).cluster.gpu_memory == 24_563 * MiB
    given = WorkloadRequest(model="gpt2", model_impl="builtin", gpu_type="rtx-4090", gpu_memory="20GiB")
    assert to_workload(given).cluster.gpu_memory == 20 * GiB
    assert to_workload(WorkloadRequest(model="gpt2", model_impl="builtin")).cluster.gpu_memory == 80 * GiB


def test_untyped_estimates_are_unchanged() -> None:
    # no type: the kind is still guessed from the memory (80 GiB: an H100's terms), as before types existed
    work = Workload(load_builtin_model("gpt2-medium"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=1024))
    terms = estimate(work, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}).overhead_terms
    assert terms["cublas_workspace"] == 64 * MiB and terms["cuda_context"] == 764 * MiB
    assert table_key(work) == "H100"
