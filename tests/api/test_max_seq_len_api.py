"""``"seq_len": "max"`` on ``/v1/estimate`` and ``/v1/recommend``: the answer beside the estimate of its config,
pins from the fields given, a margin as ``--margin`` reads it, 422 for bad input and for nothing fitting, and the
OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.estimator import estimate
from tuner.forecast import TRACE_LENGTHS, SeqSizer
from tuner.requests import WorkloadRequest, to_workload
from tuner.workload import TrialConfig

LLAMA = {"model": "llama-2-7b", "model_impl": "builtin", "gpus": 8, "seq_len": "max"}
TINY = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "gpu_memory": "64MiB", "seq_len": "max"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0, request_budget_s=600)
    with TestClient(app) as test_client:
        yield test_client


def test_estimate_max_answers_with_the_estimate_of_its_config(client: TestClient) -> None:
    response = client.post("/v1/estimate", json={"workload": LLAMA})
    assert response.status_code == 200, response.text
    data = response.json()
    answer = data["max_seq_len"]
    assert answer["seq_len"] % answer["multiple"] == 0 and answer["seq_len"] > 4096
    assert data["ds_config"] == answer["ds_config"] and data["per_gpu"]["total"] == answer["gpu_total"]
    assert data["fits"] is True and answer["next_limit"]["seq_len"] == answer["seq_len"] + answer["multiple"]
    # an independent recomputation: the estimator on the same workload at the answer's length
    workload = to_workload(WorkloadRequest(**{**LLAMA, "seq_len": 4096}))
    at = SeqSizer(workload).at(answer["seq_len"])
    trial = TrialConfig(answer["ds_config"], answer["activation_checkpointing"])
    assert estimate(at, trial).gpu_total == answer["gpu_total"]
    assert data["throughput"]["tokens_per_s"] > 0


def test_estimate_max_fields_given_pin(client: TestClient) -> None:
    body = {"workload": {**LLAMA, "activation_checkpointing": False}, "stage": 2}
    data = client.post("/v1/estimate", json=body).json()["max_seq_len"]
    assert data["ds_config"]["zero_optimization"]["stage"] == 2 and data["activation_checkpointing"] is False
    free = client.post("/v1/estimate", json={"workload": LLAMA}).json()["max_seq_len"]
    assert data["candidates"] < free["candidates"] and data["seq_len"] < free["seq_len"]


def test_estimate_max_layout_fields_given_pin(client: TestClient) -> None:
    """Ulysses and the tiled loss pin their degrees; AutoTP (no field of the length search) pins its section."""
    llama = {"model": "llama-3-8b", "gpus": 8, "seq_len": "max"}  # a transformers model: AutoTP's plan
    to_workload(WorkloadRequest(**{**llama, "seq_len": TRACE_LENGTHS[-1]}), lengths=TRACE_LENGTHS)  # profiled first
    body = {"workload": llama, "sequence_parallel": 4, "tiled_loss_shards": 4}
    data = client.post("/v1/estimate", json=body).json()["max_seq_len"]
    assert (data["sequence_parallel"], data["tiled_loss_shards"]) == (4, 4)
    data = client.post("/v1/estimate", json={"workload": llama, "tensor_parallel": 2}).json()["max_seq_len"]
    assert data["ds_config"]["tensor_parallel"] == {"autotp_size": 2} and data["sequence_parallel"] == 1


def test_recommend_max_is_an_estimate_with_the_margin(client: TestClient) -> None:
    response = client.post("/v1/recommend", json={"workload": LLAMA})
    assert response.status_code == 200, response.text
    data = response.json()
    answer = data["max_seq_len"]
    assert data["source"] == "estimate"
    # ds_config as dstune best exports it: DeepSpeed's keys, with ALST's settings in the notes
    assert data["ds_config"] == TrialConfig(answer["ds_config"]).deepspeed_config()
    assert "dstune" in answer["ds_config"] and "dstune" not in data["ds_config"]
    assert any(note.startswith("dstune.tiled_loss_shards") for note in data["notes"])
    assert data["estimated_peak_bytes"] == answer["gpu_total"]
    assert data["estimated_peak_bytes"] * (1 + data["margin"]) <= 80 * 2**30
    plain = client.post("/v1/estimate", json={"workload": LLAMA}).json()["max_seq_len"]
    assert answer["seq_len"] <= plain["seq_len"]  # the margin never lengthens it
    assert client.post("/v1/recommend", json={"workload": {**LLAMA, "gpu_memory": "2GiB"}}).status_code == 422


def test_openapi_documents_max_and_the_answer(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"MaxSeqLenOut", "NextLimitOut", "LongestWorkloadInput"} <= schema.keys()
    seq = schema["LongestWorkloadInput"]["properties"]["seq_len"]
    assert any(option.get("const") == "max" or option.get("enum") == ["max"] for option in seq["anyOf"])
    assert "max_seq_len" in schema["EstimateResponse"]["properties"]
    assert "max_seq_len" in schema["RecommendResponse"]["properties"]


# ``margin`` takes what ``--margin`` takes (the docs say "as ``--margin``"): "10%" as well as 0.1.


def test_a_percentage_margin_answers_as_its_fraction(client: TestClient) -> None:
    percent = client.post("/v1/estimate", json={"workload": TINY, "margin": "10%"})
    assert percent.status_code == 200, percent.text
    fraction = client.post("/v1/estimate", json={"workload": TINY, "margin": 0.1}).json()
    assert percent.json()["max_seq_len"]["margin"] == 0.1
    assert percent.json()["max_seq_len"]["seq_len"] == fraction["max_seq_len"]["seq_len"]


@pytest.mark.parametrize("margin", ["ten", "60%"])
def test_a_margin_that_does_not_read_is_422_naming_it(client: TestClient, margin: str) -> None:
    response = client.post("/v1/estimate", json={"workload": TINY, "margin": margin})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == "margin"
