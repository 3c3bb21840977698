"""GPU types: a device's name and memory to its type, the memory each exposes to PyTorch (below what nvidia-smi
reports), and the cluster's checks (an unknown type, a type on CPU ranks, bf16 on a V100) in one line naming the
field."""

from __future__ import annotations

import pytest

from tuner.workload import (
    GPU_TYPES,
    ClusterSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    gpu_type_of,
    load_builtin_model,
    workload_to_dict,
)

GiB = 2**30
MiB = 2**20


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", None, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", None, "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", 40_536 * MiB, "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", 81_050 * MiB, "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", 81_089 * MiB, "h100-80gb"),
        ("NVIDIA H200", 143_156 * MiB, "h200"),
        ("NVIDIA L40S", 45_589 * MiB, "l40s"),
        ("NVIDIA GeForce RTX 3090", 24_268 * MiB, "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", 24_563 * MiB, "rtx-4090"),
        ("Tesla V100-SXM2-16GB", 16_160 * MiB, "v100-16gb"),
        ("Tesla V100-PCIE-32GB", 32_510 * MiB, "v100-32gb"),
        ("Tesla V100-SXM2-32GB", None, "v100-32gb"),
        ("Tesla T4", 15_360 * MiB, None),
        ("", None, None),
    ],
)
def test_device_names_map_to_their_type(name: str, memory: int | None, expected: str | None) -> None:
    assert gpu_type_of(name, memory) == expected


def test_usable_memory_is_what_pytorch_sees_not_the_marketing_size() -> None:
    # nvidia-smi's totals (modal-labs/modal-client PR #2797): PyTorch's total_memory is below each
    smi = {"h100-80gb": 81_559, "a100-80gb": 81_920, "a100-40gb": 40_960, "l40s": 46_068}
    for name, total in smi.items():
        assert GPU_TYPES[name].usable_memory < total * MiB
    assert GPU_TYPES["h100-80gb"].usable_memory < 80 * GiB  # the old --gpu-memory 80GiB default was too much
    assert all(gpu.usable_memory > 0.9 * nominal * 1e9 for gpu, nominal in _nominal())


def _nominal() -> list[tuple]:
    sizes = {"a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h200": 141, "l40s": 48, "rtx-3090": 24}
    sizes |= {"rtx-4090": 24, "v100-16gb": 16, "v100-32gb": 32}
    return [(GPU_TYPES[name], size) for name, size in sizes.items()]


def test_the_cluster_refuses_an_unknown_type_and_a_type_on_cpu_ranks() -> None:
    with pytest.raises(WorkloadError, match=r"^gpu-type: must be one of a100-40gb"):
        ClusterSpec(gpu_type="x100")
    with pytest.raises(WorkloadError, match=r"^gpu-type: a GPU type needs device cuda"):
        ClusterSpec(gpu_type="h100-80gb", device="cpu")


@pytest.mark.parametrize("gpu", ["v100-16gb", "v100-32gb"])
def test_bf16_on_a_v100_is_refused_naming_precision(gpu: str) -> None:
    model = load_builtin_model("gpt2")
    with pytest.raises(WorkloadError, match=rf"^precision: bf16 needs an Ampere or newer GPU: {gpu} has no bf16"):
        Workload(model, ClusterSpec(gpu_type=gpu))
    Workload(model, ClusterSpec(gpu_type=gpu), TrainSpec(precision="fp16"))  # fp16 trains


def test_untyped_workloads_keep_their_stored_dict_and_fingerprint() -> None:
    model = load_builtin_model("gpt2")
    plain = Workload(model)
    assert "gpu_type" not in workload_to_dict(plain)["cluster"]
    typed = Workload(model, ClusterSpec(gpu_type="h100-80gb"))
    assert workload_to_dict(typed)["cluster"]["gpu_type"] == "h100-80gb"
    assert typed.fingerprint() != plain.fingerprint()
