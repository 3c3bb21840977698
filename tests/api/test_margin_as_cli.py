"""``/v1/estimate``'s ``margin`` takes what ``--margin`` takes: ``"10%"`` as well as ``0.1`` (the docs say "as
``--margin``"), the same answer for both; a margin that reads as neither is 422 naming ``margin``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app

TINY = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "gpu_memory": "64MiB", "seq_len": "max"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0, request_budget_s=600)
    with TestClient(app) as test_client:
        yield test_client


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
