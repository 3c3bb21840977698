"""A seq_len "max" answer is kept under the canonical request (the same question in another key order is one
computation; a field pinned at its default is another question), slots are per client where the token holder is a
client of its own, and a 503 says when the running computation is expected to end. The app in this process with its
real estimator; the computation held by a gate where a test needs it running."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.api.routes import estimate as estimate_route

TINY_LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000}  # fmt: skip
REORDERED = dict(reversed(list(TINY_LLAMA.items())))
LONG = {"model_impl": "builtin", "gpus": 8, "seq_len": "max"}
AUTH = {"Authorization": "Bearer tok"}


@pytest.fixture
def app_and_calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[TestClient, list[int]]]:
    real, calls = estimate_route.longest, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimate_route, "longest", counted)
    app = create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0, request_budget_s=600)
    with TestClient(app) as client:
        yield client, calls


def test_the_same_question_in_another_key_order_is_one_computation(app_and_calls: tuple[TestClient, list]) -> None:
    client, calls = app_and_calls
    first = client.post("/v1/estimate", json={"workload": {"config": TINY_LLAMA, **LONG}})
    again = client.post("/v1/estimate", json={"workload": {**LONG, "config": REORDERED}})
    assert first.status_code == again.status_code == 200, first.text
    assert again.json() == first.json() and len(calls) == 1


def test_a_field_pinned_at_its_default_is_another_question(app_and_calls: tuple[TestClient, list]) -> None:
    client, calls = app_and_calls
    workload = {"model": "llama-2-7b", **LONG}
    pinned = client.post("/v1/estimate", json={"workload": workload, "offload_optimizer": "none"})  # the default
    searched = client.post("/v1/estimate", json={"workload": workload})
    assert pinned.status_code == searched.status_code == 200, searched.text
    assert "offload_optimizer" not in pinned.json()["ds_config"]["zero_optimization"]  # pinned: kept on the GPUs
    assert searched.json()["ds_config"]["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}  # searched
    assert len(calls) == 2


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[TestClient, threading.Event]]:
    """An app whose seq_len max estimates wait for the gate: running computations the test controls."""
    real, gate = estimate_route.longest, threading.Event()

    def gated(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(120), "the test never opened the gate"
        return real(*args, **kwargs)

    monkeypatch.setattr(estimate_route, "longest", gated)
    app = create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0, request_budget_s=0.2)
    with TestClient(app) as client:
        yield client, gate
    gate.set()


def test_the_token_holder_is_a_client_of_its_own(held: tuple[TestClient, threading.Event]) -> None:
    client, gate = held
    body = {"workload": {"model": "llama-2-7b", **LONG}}
    assert client.post("/v1/estimate", json=body).status_code == 503  # this address's one slot, still computing
    other = {"workload": {**body["workload"], "gpus": 4}}
    refused = client.post("/v1/estimate", json=other)
    assert refused.status_code == 503 and "this client" in refused.json()["detail"]
    made_up = client.post("/v1/estimate", json=other, headers={"Authorization": "Bearer guessed"})
    assert made_up.status_code == 503 and "this client" in made_up.json()["detail"]  # a wrong token buys nothing
    with_token = client.post("/v1/estimate", json=other, headers=AUTH)
    assert with_token.status_code == 503 and "budget" in with_token.json()["detail"]  # started: its own slot
    gate.set()


def test_a_503_says_when_the_running_computation_is_expected_to_end(
    held: tuple[TestClient, threading.Event],
) -> None:
    client, gate = held
    cache = client.app.state.expensive_cache  # type: ignore[attr-defined]
    for _ in range(3):  # three computations that took about 40 s each, as the server measured them
        cache.durations._recent.append(40.0)
    body = {"workload": {"model": "llama-2-7b", **LONG}}
    late = client.post("/v1/estimate", json=body)
    assert late.status_code == 503 and "budget" in late.json()["detail"]
    assert 30 <= int(late.headers["Retry-After"]) <= 40  # about 40 s less what it has run, not a fixed 5 s
    busy = client.post("/v1/estimate", json={"workload": {**body["workload"], "gpus": 4}})
    assert busy.status_code == 503 and "nothing was started" in busy.json()["detail"]
    assert 30 <= int(busy.headers["Retry-After"]) <= 40  # the slot frees when that computation ends
    assert f"retry in {busy.headers['Retry-After']} s" in busy.json()["detail"]
    gate.set()
