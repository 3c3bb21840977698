"""Bounded cost per request: hostile but plausible-looking workloads are refused by validation before
any work (422 naming the field, nothing written), an answer past the request's time budget is 503 + Retry-After
while it is still computed and cached for the retry, and a new model's profile past a full profiling queue is 503 +
Retry-After at once, queueing nothing."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.api.routes import estimate as estimate_route
from tuner.api.routes import recommend as recommend_route
from tuner.profile.cache import ProfileCache
from tuner.profile.service import ProfileService, default_service
from tuner.requests import workload as inputs
from tuner.workload import preset_config

LLAMA = preset_config("llama-2-7b")
HOSTILE: list[tuple[str, dict[str, Any], list[str | int]]] = [
    ("/v1/estimate", {"config": {**LLAMA, "num_hidden_layers": 10**9}}, ["config", "num_hidden_layers"]),
    (
        "/v1/estimate",
        {"config": {**LLAMA, "num_hidden_layers": 10**9}, "model_impl": "builtin"},
        ["config", "num_hidden_layers"],
    ),
    (
        "/v1/estimate",
        {"config": {**LLAMA, "num_hidden_layers": 10**7}, "model_impl": "builtin"},
        ["config", "num_hidden_layers"],
    ),
    ("/v1/estimate", {"config": {**LLAMA, "vocab_size": 2**40}}, ["config", "vocab_size"]),
    ("/v1/estimate", {"config": {**LLAMA, "num_local_experts": 10**6}}, ["config", "num_local_experts"]),
    (
        "/v1/estimate",
        {"config": {**LLAMA, "num_hidden_layers": 256, "num_attention_heads": 4096, "head_dim": 2**17}},
        ["config"],
    ),
    ("/v1/recommend", {"model": "llama-2-7b", "seq_len": 2**20, "gpus": 4096, "nodes": 4096}, ["nodes"]),
    ("/v1/recommend", {"config": {**LLAMA, "num_hidden_layers": 10**9}}, ["config", "num_hidden_layers"]),
    ("/v1/recommend", {"model": "llama-2-7b", "seq_len": 2**26 + 1}, ["seq_len"]),
]


class _NoProfiles:
    def profile(self, *args: object) -> None:
        raise AssertionError("the profiling service was asked")


def _rows(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        tables = [name for (name,) in connection.execute("select name from sqlite_master where type='table'")]
        return {table: connection.execute(f'select count(*) from "{table}"').fetchone()[0] for table in tables}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "dstune.db"


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(f"sqlite:///{db}", None, recommend_cache_s=2.0)) as test_client:
        yield test_client


@pytest.mark.parametrize(("path", "workload", "loc"), HOSTILE)
def test_hostile_workloads_are_refused_before_work(
    monkeypatch: pytest.MonkeyPatch, client: TestClient, db: Path, path: str, workload: dict, loc: list
) -> None:
    monkeypatch.setattr(inputs, "default_service", _NoProfiles)  # no model is described, in any process
    before = _rows(db)
    started = time.perf_counter()
    response = client.post(path, json={"workload": workload})
    assert time.perf_counter() - started < 10  # generous: the work done is bounded by _NoProfiles and the limits
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["body", "workload"]
    assert response.json()["detail"][0]["loc"][2:] == loc
    assert _rows(db) == before
    assert not client.app.state.recommend_cache._entries  # type: ignore[attr-defined]  # refused before any thread


def test_a_serving_app_caps_the_profile_wait_at_half_its_budget(db: Path) -> None:
    service = default_service()
    saved = service.wait_s
    with TestClient(create_app(f"sqlite:///{db}", None, request_budget_s=4)):
        assert service.wait_s == min(saved, 2)
    assert service.wait_s == saved


def test_recommend_past_its_budget_is_503_then_answered_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, db: Path
) -> None:
    real = recommend_route.recommend
    calls: list[int] = []
    finished = threading.Event()

    def slow(*args: Any) -> Any:
        calls.append(1)
        time.sleep(1.0)
        answer = real(*args)
        finished.set()
        return answer

    monkeypatch.setattr(recommend_route, "recommend", slow)
    app = create_app(f"sqlite:///{db}", None, recommend_cache_s=60, request_budget_s=0.2)
    body = {"workload": {"model": "gpt2", "seq_len": 512, "model_impl": "builtin"}}
    with TestClient(app) as client:
        late = client.post("/v1/recommend", json=body)
        assert late.status_code == 503 and late.headers["Retry-After"] == "5"
        assert "budget" in late.json()["detail"]
        assert finished.wait(120)  # the computation went on in its thread ...
        deadline = time.monotonic() + 120
        while True:  # ... and lands in the cache just after it returns
            answer = client.post("/v1/recommend", json=body)
            if answer.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.status_code == 200 and answer.json()["source"] == "estimate"
        assert len(calls) == 1  # from the cache, not a second computation


def test_estimate_past_its_budget_is_503(monkeypatch: pytest.MonkeyPatch, db: Path) -> None:
    real = estimate_route.checked_estimate

    def slow(*args: Any) -> Any:
        time.sleep(0.6)
        return real(*args)

    monkeypatch.setattr(estimate_route, "checked_estimate", slow)
    body = {"workload": {"model": "gpt2", "model_impl": "builtin"}}
    with TestClient(create_app(f"sqlite:///{db}", None, request_budget_s=0.1)) as client:
        late = client.post("/v1/estimate", json=body)
        assert late.status_code == 503 and int(late.headers["Retry-After"]) > 0
    with TestClient(create_app(f"sqlite:///{db}", None, request_budget_s=0)) as client:  # 0: no budget
        assert client.post("/v1/estimate", json=body).status_code == 200


def test_a_full_profiling_queue_is_503_with_retry_after_and_queues_nothing(
    monkeypatch: pytest.MonkeyPatch, db: Path, tmp_path: Path
) -> None:
    release, calls = threading.Event(), []

    def worker(config: dict[str, Any], *args: Any) -> tuple[str, str]:  # holds its job, then refuses the config
        calls.append(config["num_hidden_layers"])
        assert release.wait(60), "the test never released the worker"
        return "model.num_hidden_layers", "not a model this worker profiles"

    service = ProfileService(
        ProfileCache(tmp_path / "profiles"), wait_s=0.0, max_queued=1, worker=worker, pool=lambda: ThreadPoolExecutor(1)
    )
    monkeypatch.setattr(inputs, "default_service", lambda: service)

    def body(layers: int) -> dict[str, Any]:
        return {"workload": {"config": {**LLAMA, "num_hidden_layers": layers}, "gpus": 8, "gpu_memory": "80GiB"}}

    try:
        with TestClient(create_app(f"sqlite:///{db}", None)) as client:
            pending = client.post("/v1/estimate", json=body(2))
            assert pending.status_code == 503 and int(pending.headers["Retry-After"]) > 0
            assert "being computed" in pending.json()["detail"]
            for path in ("/v1/estimate", "/v1/recommend"):
                full = client.post(path, json=body(3))
                assert full.status_code == 503, full.text
                assert int(full.headers["Retry-After"]) > 0
                assert "profiling queue is full" in full.json()["detail"]
            again = client.post("/v1/estimate", json=body(2))  # the same model joins its job: pending, not full
            assert again.status_code == 503 and "being computed" in again.json()["detail"]
            release.set()
            deadline = time.monotonic() + 60
            while service.queued:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            refused = client.post("/v1/estimate", json=body(2))  # the worker's refusal: 422 naming the field
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["loc"] == ["body", "workload", "config", "num_hidden_layers"]
            assert calls == [2]  # the refused requests queued nothing
    finally:
        release.set()
        service.close()


def test_a_long_seq_len_max_estimate_is_computed_once_and_the_retry_is_answered_from_memory(
    monkeypatch: pytest.MonkeyPatch, db: Path
) -> None:
    real = estimate_route.longest
    calls: list[int] = []
    finished, release = threading.Event(), threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        release.wait(120)  # longer than the budget: held until the test has seen the 503s
        answer = real(*args, **kwargs)
        finished.set()
        return answer

    monkeypatch.setattr(estimate_route, "longest", slow)
    app = create_app(f"sqlite:///{db}", None, recommend_cache_s=0, request_budget_s=0.2)
    body = {"workload": {"model": "llama-2-7b", "model_impl": "builtin", "gpus": 8, "seq_len": "max"}}
    other = {"workload": {**body["workload"], "gpus": 4}}
    with TestClient(app) as client:
        for _ in range(3):  # retries join the one computation
            late = client.post("/v1/estimate", json=body)
            assert late.status_code == 503 and "budget" in late.json()["detail"]
        busy = client.post("/v1/estimate", json=other)  # another long one from the same client: refused unstarted
        assert busy.status_code == 503 and "nothing was started" in busy.json()["detail"]
        assert int(busy.headers["Retry-After"]) > 0
        release.set()
        assert finished.wait(120)
        deadline = time.monotonic() + 120
        while (answer := client.post("/v1/estimate", json=body)).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer.status_code == 200 and answer.json()["max_seq_len"]["seq_len"] > 4096
        assert len(calls) == 1
