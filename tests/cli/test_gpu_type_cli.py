"""``--gpu-type`` on the CLI and ``gpu_type`` on the API: the type's usable memory and terms in the estimate, bad
input in one line naming the field (exit 2, 422), and measure/tune reading the type from this machine's GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.api import create_app
from tuner.cli import local_gpu
from tuner.cli.app import app
from tuner.cli.options import WorkloadFlags
from tuner.measure.driver.local_gpu import LocalGpu

runner = CliRunner()
GPT2 = ["--model", "gpt2", "--model-impl", "builtin", "--gpus", "2", "--stage", "2"]
MiB = 2**20


def test_estimate_with_a_gpu_type_uses_its_memory_and_terms() -> None:
    result = runner.invoke(app, ["estimate", *GPT2, "--gpu-type", "h200", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpu_memory"] == 143_156 * MiB and data["overhead_terms"]["cublas_workspace"] == 64 * MiB


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--gpu-type", "v100-16gb"], "precision"),  # bf16, the default precision
        (["--gpu-type", "x100"], "gpu-type"),
        (["--gpu-type", "h100-80gb", "--device", "cpu"], "gpu-type"),
    ],
)
def test_bad_gpu_types_exit_2_naming_the_field(args: list[str], field: str) -> None:
    assert_usage_error(runner.invoke(app, ["estimate", *GPT2, *args, "--json"]), field)


def test_measure_and_tune_read_the_type_from_this_machines_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    read = LocalGpu("NVIDIA GeForce RTX 4090", 24_000 * MiB, "rtx-4090")
    monkeypatch.setattr(local_gpu, "gpu_device_files", lambda: True)
    monkeypatch.setattr("tuner.measure.driver.local_gpu.local_gpu", lambda: read)
    flags = local_gpu.with_local_gpu(WorkloadFlags(device=None), "local", None)
    assert (flags.gpu_type, flags.gpu_memory) == ("rtx-4090", str(24_000 * MiB))  # the device's own bytes
    given = local_gpu.with_local_gpu(WorkloadFlags(gpu_type="h200"), "local", None)
    assert (given.gpu_type, given.gpu_memory) == ("h200", None)  # a given type keeps its own memory
    capped = local_gpu.with_local_gpu(WorkloadFlags(gpu_memory="20GiB"), "local", None)
    assert (capped.gpu_type, capped.gpu_memory) == ("rtx-4090", "20GiB")
    assert local_gpu.with_local_gpu(WorkloadFlags(device="cpu"), "local", None).gpu_type is None
    assert local_gpu.with_local_gpu(WorkloadFlags(), "ray", "10.0.0.1:6379").gpu_type is None  # another machine's


def test_the_api_takes_gpu_type_and_refuses_bf16_on_a_v100(tmp_path: Path) -> None:
    workload = {"model": "gpt2", "model_impl": "builtin", "gpus": 2, "gpu_type": "l40s"}
    with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0)) as client:
        response = client.post("/v1/estimate", json={"workload": workload})
        bad = client.post("/v1/estimate", json={"workload": {**workload, "gpu_type": "v100-32gb"}})
    assert response.status_code == 200, response.text
    assert response.json()["gpu_memory"] == 45_589 * MiB
    assert bad.status_code == 422 and "precision" in bad.text and "bf16" in bad.text
