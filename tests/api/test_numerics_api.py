"""``/v1/estimate`` takes the numerics-changing choices as the CLI's flags do (the one request schema)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app

TOKEN = "numerics-token"
TINY = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "seq_len": 256}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(f"sqlite:///{tmp_path / 'dstune.db'}", TOKEN, recommend_cache_s=0, request_budget_s=600)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as test_client:
        yield test_client


def test_estimate_takes_bf16_master_weights_and_optimizer_states(client: TestClient) -> None:
    reference = client.post("/v1/estimate", json={"workload": TINY, "stage": 3})
    body = {"workload": TINY, "stage": 3, "bf16_master_weights": True, "bf16_optimizer_states": True}
    bf16 = client.post("/v1/estimate", json=body)
    assert reference.status_code == bf16.status_code == 200, bf16.text
    assert bf16.json()["ds_config"]["bf16"] == {
        "enabled": True,
        "bf16_master_weights_and_grads": True,
        "bf16_optimizer_states": True,
    }
    assert 2 * bf16.json()["per_gpu"]["optimizer_states"] == reference.json()["per_gpu"]["optimizer_states"]


def test_estimate_takes_muon_and_the_chunked_loss(client: TestClient) -> None:
    response = client.post(
        "/v1/estimate", json={"workload": TINY, "stage": 1, "optimizer": "muon", "chunked_loss": True}
    )
    assert response.status_code == 200, response.text
    config = response.json()["ds_config"]
    assert config["optimizer"]["type"] == "Muon" and config["dstune"] == {"chunked_loss": True}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"stage": 2, "bf16_optimizer_states": True}, ["body", "ds_config", "bf16", "bf16_optimizer_states"]),
        ({"stage": 3, "optimizer": "muon"}, ["body", "ds_config", "optimizer", "type"]),
        ({"stage": 2, "optimizer": "sgd"}, ["body", "optimizer"]),
    ],
)
def test_refused_choices_are_422_naming_the_field(client: TestClient, body: dict, loc: list[str]) -> None:
    response = client.post("/v1/estimate", json={"workload": TINY, **body})
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert any(found[: len(loc)] == loc for found in locs), locs
