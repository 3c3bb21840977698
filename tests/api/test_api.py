"""The HTTP API (``tuner.api``) through FastAPI's TestClient, on SQLite and PostgreSQL, plus a schemathesis run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from postgres import fresh_database

from conftest import BACKENDS
from tuner.api import create_app
from tuner.estimator import estimate
from tuner.forecast.layouts import label
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store
from tuner.workload import ParallelLayout, TrialConfig, Workload

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GPT2 = {"model": "gpt2", "gpus": 2, "gpu_memory": "24GiB", "seq_len": 512}


@pytest.fixture(scope="module", autouse=True)
def gpt2_profiled() -> None:
    """GPT2's model profile on disk before any request asks for it (profiled inline, as the CLI does): the API's
    service profiles a new model in a spawned process and answers 503 until it is done, which on a loaded machine
    outlasts a request's budget; that path has its own tests (test_bounded.py, test_service.py)."""
    to_workload(WorkloadRequest(**GPT2))


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    # a request waits for a new model's profile (built in a spawned process: slow on a loaded machine) rather than
    # answering 503 past its budget: the budget has its own tests (test_bounded.py)
    app = create_app(url, TOKEN, max_body_bytes=100_000, recommend_cache_s=0, request_budget_s=600)
    with TestClient(app) as test_client:
        yield test_client


def store_of(client: TestClient) -> Store:
    return client.app.state.store  # type: ignore[attr-defined]


def seed_study(
    store: Store, name: str, workload: Workload, trials: list[tuple[dict[str, Any], str, float | None, int | None]]
) -> list[int]:
    """A study of ``workload`` holding ``trials``: (ds_config, status, tokens/s, measured peak), recorded through the
    store as the tuner records them."""
    study = store.get_or_create_study(name, store.upsert_workload(workload), "tpe", {})
    ids = []
    for number, (config, status, tokens, peak) in enumerate(trials):
        est = estimate(workload, config)
        if status == "pruned":
            ids.append(store.add_trial(study.id, number, f"k{number}", config, {}, False, est, "pruned", "too big"))
            continue
        trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, est)
        store.start_trial(trial_id)
        store.finish_trial(trial_id, status, {"tokens_per_s": tokens, "peak_bytes_per_rank": [peak, peak]})
        ids.append(trial_id)
    return ids


def ds_config(stage: int, micro: int, world: int = 2) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * world,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }


# ------------------------------------------------------------------------------------------------ health, estimate


def test_healthz(client: TestClient, url: str) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": url.split(":")[0].split("+")[0]}


def test_estimate_matches_the_estimator(client: TestClient) -> None:
    body = {"workload": GPT2, "stage": 2, "ds_config": {"zero_optimization": {"overlap_comm": True}}}
    response = client.post("/v1/estimate", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    workload = to_workload(WorkloadRequest(**GPT2))
    expected = estimate(workload, data["ds_config"]).to_dict()
    assert data["ds_config"]["zero_optimization"] == {"stage": 2, "overlap_comm": True}  # ds_config wins over stage
    assert data["per_gpu"] == expected["per_gpu"] and data["fits"] == expected["fits"]
    assert data["n_params"] == 124439808 and data["world_size"] == 2
    assert data["overhead_terms"] == expected["overhead_terms"] and "nccl_data_parallel" in data["overhead_terms"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"workload": {**GPT2, "gpu_memory": "80XB"}}, ["body", "workload", "gpu_memory"]),
        ({"workload": {**GPT2, "gpus": 0}}, ["body", "workload", "gpus"]),
        ({"workload": {**GPT2, "model": "no-such-preset"}}, ["body", "workload", "model"]),
        ({"workload": {**GPT2, "model": "../../etc/passwd"}}, ["body", "workload", "model"]),
        ({"workload": {"gpus": 2}}, ["body", "workload", "model"]),
        ({"workload": {**GPT2, "params": 1e9}}, ["body", "workload", "model"]),
        ({"workload": {"config": {"model_type": "llama", "hidden_size": -4}}}, ["body", "workload", "config"]),
        ({"workload": GPT2, "ds_config": {"zero_optimization": {"stage": 7}}}, ["body", "ds_config"]),
        ({"workload": GPT2, "import": "os.system"}, ["body", "import"]),
        ({"workload": GPT2, "sequence_parallel": 0}, ["body", "sequence_parallel"]),
        ({"workload": GPT2, "sequence_parallel": 4}, ["body", "ds_config", "sequence_parallel_size"]),  # 2 ranks
        (
            {"workload": GPT2, "ds_config": {"sequence_parallel_size": 2}, "tiled_loss_shards": 1024},
            ["body", "ds_config", "dstune", "tiled_loss_shards"],
        ),
        ({"workload": GPT2, "offload_checkpoints": True}, ["body", "ds_config", "dstune", "offload_checkpoints"]),
        (
            {"workload": {**GPT2, "gpus": 8}, "ds_config": {"tensor_parallel": {"autotp_size": 8}}},
            ["body", "ds_config", "tensor_parallel", "autotp_size"],  # GPT-2's 12 heads
        ),
        ({"workload": GPT2, "expert_parallel": 2}, ["body", "ds_config", "expert_parallel", "autoep_size"]),  # dense
        (
            {"workload": GPT2, "ds_config": {"expert_parallel": {"enabled": True, "autoep_size": 2}}},
            ["body", "ds_config", "expert_parallel", "autoep_size"],
        ),
        (
            {"workload": GPT2, "ds_config": {"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}}},
            ["body", "ds_config", "zero_optimization", "zero_hpz_partition_size"],
        ),
    ],
)
def test_estimate_rejects_bad_input_with_the_field_path(client: TestClient, body: dict, loc: list[str]) -> None:
    response = client.post("/v1/estimate", json=body)
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert any(found[: len(loc)] == loc for found in locs), locs


def test_estimate_inline_config_and_ds_config_key_paths(client: TestClient) -> None:
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2}
    response = client.post("/v1/estimate", json={"workload": {"config": {**config, "num_attention_heads": 3}}})
    assert response.status_code == 422  # transformers rejects 3 heads for hidden size 256: the path names the field
    assert response.json()["detail"][0]["loc"] == ["body", "workload", "config", "hidden_size"]
    bad_stage = {"workload": GPT2, "ds_config": {"zero_optimization": {"stage": 7}}}
    assert client.post("/v1/estimate", json=bad_stage).json()["detail"][0]["loc"] == [
        "body",
        "ds_config",
        "zero_optimization",
        "stage",
    ]
    good = {"config": {**config, "vocab_size": 1000, "intermediate_size": 512}, "params": None}
    assert client.post("/v1/estimate", json={"workload": good}).status_code == 200


def test_huge_body_is_413(client: TestClient) -> None:
    big = {"workload": {**GPT2, "config": None}, "ds_config": {"padding": "x" * 200_000}}
    answer = client.post("/v1/estimate", json=big)
    assert answer.status_code == 413  # in JSON, as the schema documents it (Starlette's own answer is plain text)
    assert answer.headers["content-type"] == "application/json" and "--max-body-bytes" in answer.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'{"workload": {"model": "gpt2"}, "ds_config": {"x": "'
        for _ in range(30):
            yield b"y" * 10_000
        yield b'"}}'

    streamed = client.post("/v1/estimate", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and "--max-body-bytes" in streamed.json()["detail"]


# ------------------------------------------------------------------------------------------------------- recommend


def test_recommend_estimate_when_nothing_is_measured(client: TestClient) -> None:
    response = client.post("/v1/recommend", json={"workload": GPT2})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["source"] == "estimate" and data["trial_id"] is None and data["tokens_per_s"] is None
    # the fitting config the throughput model predicts fastest (the real transformers GPT-2's traced activations
    # leave micro-batch 32 out at stage 0 in 24 GiB)
    assert data["predicted_tokens_per_s"] > 0 and data["prediction"]["tokens_per_s"] == data["predicted_tokens_per_s"]
    workload = to_workload(WorkloadRequest(**GPT2))
    trial = TrialConfig(data["ds_config"], data["activation_checkpointing"])  # the answer is one trial config
    assert estimate(workload, trial).gpu_total == data["estimated_peak_bytes"]
    assert data["estimated_peak_bytes"] * (1 + data["margin"]) <= 24 * 2**30


def test_recommend_70b_on_two_nodes_compares_tp_and_hpz_layouts(client: TestClient) -> None:
    """The issue's case, nothing measured: Llama 3.1 70B on 2 nodes × 8 × 80 GB. The answer fits, lists the best
    config of each AutoTP and hpZ layout (tp > 1 and hpZ > 1 among them) and says why its own layout wins."""
    request = {"model": "llama-3.1-70b", "gpus": 8, "nodes": 2, "gpu_memory": "80GiB", "seq_len": 4096}
    to_workload(WorkloadRequest(**request))  # profiled inline first (the gpt2_profiled fixture says why)
    response = client.post("/v1/recommend", json={"workload": request})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["source"] == "estimate" and data["estimated_peak_bytes"] * (1 + data["margin"]) <= 80 * 2**30
    considered = data["considered"]
    assert any(c["tensor_parallel"] > 1 for c in considered) and any(c["hpz_partition_size"] > 1 for c in considered)
    (chosen,) = [c for c in considered if c["chosen"]]
    assert chosen["fits"] and chosen["predicted_tokens_per_s"] == data["predicted_tokens_per_s"]
    tp = data["ds_config"].get("tensor_parallel", {}).get("autotp_size", 1)
    hpz = data["ds_config"]["zero_optimization"].get("zero_hpz_partition_size", 1)
    assert (chosen["tensor_parallel"], chosen["hpz_partition_size"]) == (tp, hpz)
    assert data["why"].startswith(label(ParallelLayout(tensor_parallel=tp, hpz_partition_size=hpz)) + ": ")
    assert "ConsideredLayout" in client.get("/openapi.json").json()["components"]["schemas"]


def test_recommend_no_feasible_config_is_422(client: TestClient) -> None:
    response = client.post("/v1/recommend", json={"workload": {"model": "llama-2-7b", "gpu_memory": "1GiB"}})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "workload"]


def test_recommend_measured_picks_the_fastest_ok_trial(client: TestClient) -> None:
    store = store_of(client)
    workload = to_workload(WorkloadRequest(**GPT2))
    ids = seed_study(
        store,
        "measured",
        workload,
        [
            (ds_config(0, 1), "ok", 1000.0, 3 * 2**30),
            (ds_config(1, 4), "ok", 5000.0, 9 * 2**30),
            (ds_config(2, 8), "oom", None, None),
            (ds_config(3, 64), "pruned", None, None),
            (ds_config(2, 2), "ok", 3000.0, 5 * 2**30),
        ],
    )
    # micro_batch, grad_accum and checkpointing in the request are ignored: they are what is recommended
    response = client.post("/v1/recommend", json={"workload": {**GPT2, "micro_batch": 8}})
    data = response.json()
    assert data["source"] == "measured" and data["trial_id"] == ids[1] and data["study"] == "measured"
    assert data["tokens_per_s"] == 5000.0 and data["peak_bytes"] == 9 * 2**30
    assert data["ds_config"] == ds_config(1, 4) and data["measured_on"] == data["workload_fingerprint"]
    assert data["considered"] is None and data["why"] is None  # the estimate source's comparison: none was made


def test_recommend_nearest_rechecks_other_workloads_of_the_model(client: TestClient) -> None:
    store = store_of(client)
    other = to_workload(WorkloadRequest(**{**GPT2, "gpu_memory": "80GiB"}))  # same model, bigger GPUs
    ids = seed_study(
        store,
        "big-gpus",
        other,
        [
            (ds_config(0, 64), "ok", 9000.0, 60 * 2**30),  # fastest, but cannot fit in 24 GiB
            (ds_config(1, 4), "ok", 4000.0, 8 * 2**30),  # fits
            (ds_config(2, 2), "ok", 2000.0, 5 * 2**30),
        ],
    )
    seed_study(
        store, "llama", to_workload(WorkloadRequest(model="tiny-llama")), [(ds_config(0, 1, world=1), "ok", 1e6, 1)]
    )
    request = {**GPT2, "gpus": 4}  # another cluster too: train_batch_size follows the world size
    data = client.post("/v1/recommend", json={"workload": request}).json()
    assert data["source"] == "nearest" and data["trial_id"] == ids[1] and data["tokens_per_s"] == 4000.0
    assert data["study"] == "big-gpus" and data["measured_on"] == other.fingerprint()
    assert data["ds_config"]["train_batch_size"] == 4 * 4
    assert data["measured_on"] != data["workload_fingerprint"]
    assert data["estimated_peak_bytes"] * (1 + data["margin"]) <= 24 * 2**30


def test_recommend_cache_reuses_answers_for_its_ttl(url: str) -> None:
    with TestClient(create_app(url, TOKEN, recommend_cache_s=3600)) as cached:
        assert cached.post("/v1/recommend", json={"workload": GPT2}).json()["source"] == "estimate"
        seed_study(store_of(cached), "late", to_workload(WorkloadRequest(**GPT2)), [(ds_config(1, 2), "ok", 1.0, 1)])
        assert cached.post("/v1/recommend", json={"workload": GPT2}).json()["source"] == "estimate"  # cached
        cached.app.state.recommend_cache.clear()  # type: ignore[attr-defined]
        assert cached.post("/v1/recommend", json={"workload": GPT2}).json()["source"] == "measured"


def test_a_server_freezes_its_start_up_objects_out_of_the_collector(tmp_path: Path) -> None:
    """``dstune serve``'s app moves what start-up left alive out of the collector's reach (a full collection over it
    stalled every request ~85 ms, bench/results/api_load.md); an app built for tests leaves the collector alone."""
    import gc

    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    gc.unfreeze()
    try:
        with TestClient(create_app(url, TOKEN)):
            assert gc.get_freeze_count() == 0
        with TestClient(create_app(url, TOKEN, freeze_gc=True)) as served:
            assert gc.get_freeze_count() > 10_000
            assert served.post("/v1/recommend", json={"workload": GPT2}).status_code == 200
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------------------------------------- studies


def test_studies_list_detail_and_paged_trials(client: TestClient) -> None:
    store = store_of(client)
    workload = to_workload(WorkloadRequest(**GPT2))
    rows = [(ds_config(s, m), "ok", float(100 * s + m), 2**30) for s in range(3) for m in (1, 2, 4)]
    ids = seed_study(store, "paged", workload, [*rows, (ds_config(3, 64), "pruned", None, None)])
    studies = client.get("/v1/studies").json()
    assert [s["name"] for s in studies] == ["paged"]
    detail = client.get("/v1/studies/paged").json()
    assert detail["total"] == 10 and detail["counts"]["ok"] == 9 and detail["counts"]["pruned"] == 1
    assert detail["best"]["id"] == ids[8] and detail["pruned_reasons"] == {"too big": 1}
    assert detail["workload"]["cluster"]["gpus_per_node"] == 2

    first = client.get("/v1/studies/paged/trials", params={"limit": 4}).json()
    second = client.get("/v1/studies/paged/trials", params={"limit": 4, "offset": 4}).json()
    last = client.get("/v1/studies/paged/trials", params={"limit": 4, "offset": 8}).json()
    assert first["total"] == 10 and [t["number"] for t in first["items"]] == [0, 1, 2, 3]
    assert [t["number"] for t in second["items"] + last["items"]] == [4, 5, 6, 7, 8, 9]
    fastest = client.get("/v1/studies/paged/trials", params={"status": "ok", "order_by": "-tokens_per_s", "limit": 2})
    assert fastest.json()["total"] == 9 and [t["id"] for t in fastest.json()["items"]] == [ids[8], ids[7]]
    assert client.get("/v1/studies/paged/trials", params={"limit": 0}).status_code == 422
    assert client.get("/v1/studies/paged/trials", params={"order_by": "error"}).status_code == 422


def test_unknown_study_is_404(client: TestClient) -> None:
    assert client.get("/v1/studies/nope").status_code == 404
    assert client.get("/v1/studies/nope/trials").status_code == 404


# ------------------------------------------------------------------------------------------------------------ jobs


JOB = {"workload": {**GPT2, "device": "cpu"}, "trials": 3, "launcher": "local", "study": "nightly-gpt2"}


def test_jobs_need_the_token(client: TestClient) -> None:
    assert client.post("/v1/jobs", json=JOB).status_code == 401
    assert client.post("/v1/jobs", json=JOB, headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.post("/v1/jobs", json=JOB, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    created = client.post("/v1/jobs", json=JOB, headers=AUTH)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["status"] == "queued" and job["study_name"] == "nightly-gpt2" and job["request"]["trials"] == 3
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 401
    assert client.delete(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer x"}).status_code == 403
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"  # reads are open


def test_job_lifecycle_queue_cancel_and_running_cancel(client: TestClient) -> None:
    store = store_of(client)
    first = client.post("/v1/jobs", json=JOB, headers=AUTH).json()
    second = client.post("/v1/jobs", json={**JOB, "study": None}, headers=AUTH).json()
    assert second["study_name"].startswith("gpt2-")
    assert [j["id"] for j in client.get("/v1/jobs").json()] == [second["id"], first["id"]]
    cancelled = client.delete(f"/v1/jobs/{second['id']}", headers=AUTH).json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    claimed = store.claim_next_job("w1")
    assert claimed is not None and claimed.id == first["id"]
    running = client.get(f"/v1/jobs/{first['id']}").json()
    assert running["status"] == "running" and running["worker"] == "w1"
    assert client.delete(f"/v1/jobs/{first['id']}", headers=AUTH).json()["status"] == "cancel_requested"
    assert client.get("/v1/jobs", params={"status": "cancel_requested"}).json()[0]["id"] == first["id"]
    assert client.get("/v1/jobs/999999").status_code == 404
    assert client.delete("/v1/jobs/999999", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"space": "../../etc/passwd"}, ["body", "space"]),
        ({"space": "nonexistent"}, ["body", "space"]),
        ({"pins": {"stage": 9}}, ["body", "pins"]),
        ({"workload": {**GPT2, "gpu_memory": "lots"}}, ["body", "workload", "gpu_memory"]),
        ({"trials": 0}, ["body", "trials"]),
        ({"study": "bad name!"}, ["body", "study"]),
    ],
)
def test_bad_job_is_422(client: TestClient, change: dict, loc: list[str]) -> None:
    response = client.post("/v1/jobs", json={**JOB, **change}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][: len(loc)] == loc


def test_no_token_refuses_mutations_unless_insecure(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    closed = TestClient(create_app(url, None))
    assert closed.post("/v1/jobs", json=JOB).status_code == 503
    assert closed.get("/healthz").status_code == 200
    opened = TestClient(create_app(url, None, insecure_no_auth=True))
    assert opened.post("/v1/jobs", json=JOB).status_code == 201


def test_serve_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    dstune = str(Path(sys.executable).with_name("dstune"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [dstune, "serve", "--storage", f"sqlite:///{tmp_path / 'x.db'}"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and done.stderr.startswith("error: token:"), done.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = subprocess.run([dstune, "serve", "--token-file", str(empty)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "token-file" in done.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_answers_over_http_and_stops_on_sigterm(tmp_path: Path, workers: int) -> None:
    """The real server (uvicorn, one process or ``--workers 2`` built from the environment): health, a
    recommendation, the token guarding jobs, and a clean exit on SIGTERM."""
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dstune = str(Path(sys.executable).with_name("dstune"))
    env = {**os.environ, "DSTUNE_API_TOKEN": TOKEN}
    command = [dstune, "serve", "--storage", f"sqlite:///{tmp_path / 'dstune.db'}", "--port", str(port)]
    server = subprocess.Popen([*command, "--workers", str(workers)], env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                if httpx.get(f"{base}/healthz", timeout=2).json() == {"status": "ok", "database": "sqlite"}:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.2)
        for _ in range(4):  # with two processes, both get a share of the connections
            answer = httpx.post(f"{base}/v1/recommend", json={"workload": GPT2}, timeout=30)
            assert answer.status_code == 200 and answer.json()["source"] == "estimate"
        job = {"workload": GPT2}
        assert httpx.post(f"{base}/v1/jobs", json=job, timeout=10).status_code == 401
        assert httpx.post(f"{base}/v1/jobs", json=job, headers=AUTH, timeout=10).status_code == 201
    finally:
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal in a single process, which dstune turns into the
    # documented exit of a command stopped by SIGTERM (143, as a shell reports it); its supervisor exits 0
    assert server.returncode == (128 + signal.SIGTERM if workers == 1 else 0), log
    assert log.count("Application shutdown complete") == workers, log


# ---------------------------------------------------------------------------------------------------- schemathesis

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402


@pytest.fixture(scope="module", params=BACKENDS)
def fuzz_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The API over a seeded database of each backend (PostgreSQL has its own failure modes: NUL characters in
    text and JSONB, integer ranges)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'dstune.db'}"
        else:
            url = stack.enter_context(fresh_database())
        app = create_app(url, TOKEN, max_body_bytes=100_000)
        stack.callback(app.state.store.close)
        seed_study(
            app.state.store, "fuzz", to_workload(WorkloadRequest(**GPT2)), [(ds_config(1, 2), "ok", 100.0, 2**30)]
        )
        yield app


def test_no_input_makes_a_server_error(fuzz_app: Any) -> None:
    """Whatever the schema admits (and what it does not), every operation answers below 500, on SQLite and
    PostgreSQL. (Driven by hand rather than ``schemathesis.pytest.from_fixture``, which pytest 9 breaks.)"""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def answers_below_500(case: Any) -> None:
            response = case.call(headers=AUTH)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
            )

        answers_below_500()


# ------------------------------------------------------------------------------------------------ peft

TINY_LORA = {
    "model": "tiny-llama",
    "gpus": 2,
    "seq_len": 64,
    "device": "cpu",
    "peft": {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]},
}


def test_estimate_with_a_peft_adapter_reports_trainable_params(client: TestClient) -> None:
    pytest.importorskip("peft")
    response = client.post("/v1/estimate", json={"workload": TINY_LORA, "stage": 3})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["trainable_params"] == 4 * 8 * (256 + 192) < data["n_params"]
    expected = estimate(to_workload(WorkloadRequest(**TINY_LORA)), data["ds_config"]).to_dict()
    assert data["per_gpu"] == expected["per_gpu"]


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"peft": {**TINY_LORA["peft"], "r": -1}}, ["body", "workload", "peft", "r"]),
        ({"peft": {**TINY_LORA["peft"], "target_modules": ["nope"]}}, ["body", "workload", "peft", "target_modules"]),
        ({"freeze": "lora_"}, ["body", "workload", "freeze"]),
    ],
)
def test_bad_adapter_config_is_422_naming_the_field(client: TestClient, change: dict, loc: list[str]) -> None:
    pytest.importorskip("peft")
    response = client.post("/v1/estimate", json={"workload": {**TINY_LORA, **change}})
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [loc]
