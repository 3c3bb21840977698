"""Records stored before a launch variable was refused (an older dstune's allow-list): a queued job that sets one
fails with the reason and never runs, a study that sets one stays readable and is never run again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.cli.app import app
from tuner.estimator import estimate
from tuner.storage import Store
from tuner.worker import work
from tuner.workload import ClusterSpec, LaunchEnv, TrialConfig, Workload, model_from_param_count

REFUSED = {"LD_PRELOAD": "/tmp/evil.so"}


def _stored_with_a_refused_variable(db: Path) -> Store:
    """A study measured with NCCL_ALGO, its stored workload then rewritten as an older dstune would have kept it."""
    store = Store.open(f"sqlite:///{db}")
    workload = Workload(
        model_from_param_count(1e8),
        ClusterSpec(gpus_per_node=2, device="cpu"),
        launch=LaunchEnv.of(variables={"NCCL_ALGO": "Ring"}),
    )
    study = store.get_or_create_study("old", store.upsert_workload(workload), "tpe", {"space": "default", "pins": {}})
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 2}
    trial = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(workload, TrialConfig(config)))
    store.start_trial(trial)
    store.finish_trial(trial, "ok", {"peak_bytes_per_rank": [1, 1], "tokens_per_s": 100.0})
    with sqlite3.connect(db) as connection:
        ((row_id, stored),) = connection.execute("select id, workload from dstune_workloads").fetchall()
        data = json.loads(stored)
        data["launch"]["variables"] = REFUSED
        connection.execute("update dstune_workloads set workload = ? where id = ?", (json.dumps(data), row_id))
    return store


def test_a_study_stored_with_a_refused_variable_reads_but_never_runs(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _stored_with_a_refused_variable(db)
    with TestClient(create_app(f"sqlite:///{db}", "tok")) as client:
        detail = client.get("/v1/studies/old")
        assert detail.status_code == 200 and "LD_PRELOAD" not in detail.text, detail.text
        full = client.get("/v1/studies/old", headers={"Authorization": "Bearer tok"}).json()
        assert full["workload"]["launch"]["variables"] == REFUSED  # shown as stored, to a reader with the token
    result = CliRunner().invoke(app, ["best", "--study", "old", "--storage", f"sqlite:///{db}"])
    assert result.exit_code == 2 and "was stored with what is refused now" in result.stderr, result.output


def test_a_queued_job_with_a_refused_variable_fails_with_the_reason_unrun(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'jobs.db'}")
    workload = {"model": "tiny-gpt2", "device": "cpu", "seq_len": 64, "launch": {"variables": REFUSED}}
    job = store.enqueue_job("old-job", {"workload": workload, "trials": 1, "launcher": "local"})
    assert work(store, once=True) == [job.id]
    ended = store.get_job(job.id)
    assert ended is not None and ended.status == "failed" and "LD_PRELOAD" in (ended.error or ""), ended
    assert store.get_study("old-job") is None  # no study was started, so no run
