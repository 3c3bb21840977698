"""What ``/v1/recommend`` answers and ``/v1/estimate`` takes, as a user reads and pastes them: the global batch the
user trains at, every layout compared at one global batch, the ds_config exactly as ``dstune best`` exports it, the
trial's number as the CLI and dashboard show it, and every trial field ``dstune estimate`` takes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.api.schemas import EstimateRequest
from tuner.cli.app import app as cli_app
from tuner.estimator import estimate
from tuner.requests import TrialRequest, WorkloadInput, WorkloadRequest, to_workload
from tuner.storage import Store
from tuner.workload import TrialConfig

GPT2 = {"model": "gpt2", "gpus": 2, "gpu_memory": "24GiB", "seq_len": 512}
LLAMA_8B = {"model": "llama-3-8b", "gpus": 8, "gpu_memory": "80GiB", "seq_len": 4096}


@pytest.fixture(scope="module", autouse=True)
def profiled() -> None:
    """The models' profiles on disk first (the API's service would profile them in a spawned process)."""
    for request in (GPT2, LLAMA_8B):
        to_workload(WorkloadRequest(**request))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'dstune.db'}"


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    with TestClient(create_app(db, "token", recommend_cache_s=0, request_budget_s=600)) as test_client:
        yield test_client


def recommend(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/recommend", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def seed(store: Store, name: str, configs: list[tuple[dict[str, Any], float]]) -> list[int]:
    """A study of GPT2's workload whose trials 0, 1, ... measured ``configs`` at these tokens/s."""
    workload = to_workload(WorkloadRequest(**GPT2))
    study = store.get_or_create_study(name, store.upsert_workload(workload), "tpe", {})
    ids = []
    for number, (config, tokens) in enumerate(configs):
        trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, estimate(workload, config))
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "ok", {"tokens_per_s": tokens, "peak_bytes_per_rank": [2**30, 2**30]})
        ids.append(trial_id)
    return ids


def config(micro: int, accum: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
        **extra,
    }


def test_recommend_answers_at_the_global_batch_asked_and_compares_layouts_there(client: TestClient) -> None:
    """The issue's case: an 8B model on 8 × 80 GB trained at global batch 64. The answer trains 64 samples a step
    and so does every layout it compared (AutoTP 1, 2, 4, 8)."""
    data = recommend(client, {"workload": LLAMA_8B, "global_batch": 64})
    assert data["source"] == "estimate" and data["global_batch"] == 64
    trial = TrialConfig(data["ds_config"], data["activation_checkpointing"])
    assert trial.global_batch(8) == 64
    considered = data["considered"]
    assert {c["tensor_parallel"] for c in considered} == {1, 2, 4, 8}
    assert {c["global_batch"] for c in considered} == {64}
    for choice in considered:
        assert choice["micro_batch"] * choice["grad_accum"] * 8 // choice["tensor_parallel"] == 64


def test_without_a_global_batch_every_layout_is_compared_at_the_answers(client: TestClient) -> None:
    data = recommend(client, {"workload": LLAMA_8B})
    assert len(data["considered"]) == 4
    assert {c["global_batch"] for c in data["considered"]} == {data["global_batch"]}


def test_the_answer_is_what_best_exports(client: TestClient, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measured trial whose config carries dstune's own section and the space's no-op degrees 1: the answer's
    ds_config is the one ``dstune best`` writes, without them, and the trial is named by its number too."""
    stored = config(4, sequence_parallel_size=1, tensor_parallel={"autotp_size": 1}, dstune={"tiled_mlp_shards": 1})
    ids = seed(client.app.state.store, "exported", [(config(1), 100.0), (stored, 900.0)])  # type: ignore[attr-defined]
    data = recommend(client, {"workload": GPT2})
    assert data["source"] == "measured" and data["trial_id"] == ids[1] and data["trial_number"] == 1
    monkeypatch.setenv("DSTUNE_STORAGE", db)
    best = CliRunner().invoke(cli_app, ["best", "--study", "exported"])
    assert best.exit_code == 0, best.output
    assert data["ds_config"] == json.loads(best.stdout)
    assert not {"dstune", "sequence_parallel_size", "tensor_parallel"} & data["ds_config"].keys()


def test_a_measured_config_is_answered_at_the_global_batch_asked(client: TestClient) -> None:
    """Measured at 8 samples a step (micro 4 × 2 ranks); asked for 32: the same micro-batch accumulating 4 steps,
    re-checked by the estimator. A micro-batch that cannot make the global batch gives way to the next trial."""
    store = client.app.state.store  # type: ignore[attr-defined]
    ids = seed(store, "batch", [(config(4), 500.0), (config(32), 900.0)])
    data = recommend(client, {"workload": GPT2, "global_batch": 16})  # micro 32 × 2 ranks overshoots 16
    assert data["source"] == "measured" and data["trial_id"] == ids[0] and data["global_batch"] == 16
    assert data["ds_config"]["gradient_accumulation_steps"] == 2 and data["ds_config"]["train_batch_size"] == 16
    assert data["measured_global_batch"] == 8 and data["tokens_per_s"] == 500.0
    at_own = recommend(client, {"workload": GPT2})
    assert at_own["trial_id"] == ids[1] and at_own["global_batch"] == at_own["measured_global_batch"] == 64


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"workload": GPT2, "global_batch": 7}, ["body", "global_batch"]),  # not a multiple of the 2 ranks
        ({"workload": GPT2, "global_batch": 0}, ["body", "global_batch"]),
        ({"workload": {**GPT2, "seq_len": "max"}, "global_batch": 8}, ["body", "global_batch"]),
    ],
)
def test_a_bad_global_batch_is_422_at_its_field(client: TestClient, body: dict[str, Any], loc: list[str]) -> None:
    response = client.post("/v1/recommend", json=body)
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [loc]


def test_the_estimate_body_takes_every_trial_field_the_cli_takes() -> None:
    """Derived from the one trial request: its fields beside the workload, the batch split in the workload."""
    trial_fields = set(WorkloadInput.model_fields) - set(WorkloadRequest.model_fields)
    assert set(EstimateRequest.model_fields) - {"workload", "margin"} | trial_fields == set(TrialRequest.model_fields)


def test_the_estimate_asks_for_autotp_and_hpz(client: TestClient) -> None:
    """AutoTP on one node, hpZ at ZeRO-3 across two: the estimate the CLI's flags give."""
    for body, flags in (
        ({"workload": LLAMA_8B, "stage": 2, "tensor_parallel": 2}, {"stage": 2, "tensor_parallel": 2}),
        (
            {"workload": {**LLAMA_8B, "nodes": 2}, "stage": 3, "hpz_partition_size": 8},
            {"stage": 3, "hpz_partition_size": 8},
        ),
    ):
        response = client.post("/v1/estimate", json=body)
        assert response.status_code == 200, response.text
        data = response.json()
        workload = to_workload(WorkloadRequest(**body["workload"]))
        trial = TrialRequest(**flags).to_trial(workload.train.precision)
        assert data["ds_config"] == trial.ds_config
        assert data["per_gpu"] == estimate(workload, trial).to_dict()["per_gpu"]
    tp = client.post("/v1/estimate", json={"workload": LLAMA_8B, "stage": 2, "tensor_parallel": 2}).json()
    plain = client.post("/v1/estimate", json={"workload": LLAMA_8B, "stage": 2}).json()
    assert tp["per_gpu"]["parameters"] < plain["per_gpu"]["parameters"]


def test_nothing_fitting_at_the_global_batch_says_so_in_units(client: TestClient) -> None:
    body = {"workload": {**GPT2, "gpu_memory": "2GiB"}, "global_batch": 4096}
    response = client.post("/v1/recommend", json=body)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "workload"]
    assert "on 2 × 2.00 GiB with margin" in error["msg"] and error["msg"].endswith("at global batch 4096")
