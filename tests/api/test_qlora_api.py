"""A 4-bit bitsandbytes base (QLoRA) through the API: ``estimate_only`` in the estimate and recommend answers on
CUDA; 422 naming the field on CPU, and for a tuning job (measured runs cannot load bitsandbytes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("peft")

from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.requests import WorkloadRequest, to_workload

TOKEN = "s3cret-token"
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
NF4 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_quant_storage": "bfloat16"}
QLORA = {"model": "tiny-llama", "gpus": 2, "seq_len": 64, "peft": LORA, "quantization": NF4}


@pytest.fixture(scope="module", autouse=True)
def profiled() -> None:
    """tiny-llama's profile on disk before a request asks for it (the API's service would profile it in a spawned
    process, answering 503 meanwhile: tested elsewhere)."""
    to_workload(WorkloadRequest(**QLORA))


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with TestClient(create_app(url, TOKEN, recommend_cache_s=0, request_budget_s=600)) as test_client:
        yield test_client


def test_estimate_and_recommend_say_estimate_only(client: TestClient) -> None:
    body = {"workload": QLORA, "stage": 3}
    estimated = client.post("/v1/estimate", json=body)
    assert estimated.status_code == 200, estimated.text
    data = estimated.json()
    assert data["estimate_only"] is True and "bitsandbytes" in data["estimate_only_why"]
    assert data["details"]["quantized_weights_whole"] == 47_104  # bf16 storage: only the quant state stays whole
    recommended = client.post("/v1/recommend", json={"workload": QLORA})
    assert recommended.status_code == 200, recommended.text
    assert recommended.json()["estimate_only"] is True and recommended.json()["source"] == "estimate"
    plain = client.post("/v1/estimate", json={"workload": {**QLORA, "quantization": None}, "stage": 3}).json()
    assert plain["estimate_only"] is False and plain["estimate_only_why"] is None


def test_qlora_on_cpu_is_422_naming_the_field(client: TestClient) -> None:
    response = client.post("/v1/estimate", json={"workload": {**QLORA, "device": "cpu"}})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "workload", "quantization"]
    bad = client.post("/v1/estimate", json={"workload": {**QLORA, "quantization": {**NF4, "bnb_4bit_quant_type": "x"}}})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "workload", "quantization", "bnb_4bit_quant_type"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_tuning_job_is_refused_before_any_run(client: TestClient, device: str) -> None:
    job = {"workload": {**QLORA, "device": device}, "trials": 2, "study": f"qlora-{device}"}
    response = client.post("/v1/jobs", json=job, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == "quantization"
    assert client.get("/v1/jobs").json() == []  # nothing queued


def test_a_job_longer_than_the_models_learned_positions_is_refused_before_any_run(client: TestClient) -> None:
    """tiny-gpt2 learned 256 positions: a 2048-token job would fail every run with an IndexError."""
    job = {"workload": {"model": "tiny-gpt2", "gpus": 2, "device": "cpu", "seq_len": 2048}, "trials": 2}
    response = client.post("/v1/jobs", json={**job, "study": "too-long"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"][-1] == "seq_len" and "256 positions" in detail["msg"]
    assert client.get("/v1/jobs").json() == []
