"""Queued jobs that carry a training command (tuner.requests.script_job): only ``dstune queue JOB.json -- <command>``
queues one (the API answers 403 with any token), and a worker runs it only inside the folders it was told to trust
(``dstune worker --allow-scripts DIR``); otherwise the job fails with the reason and nothing of it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.cli.app import app
from tuner.storage import Store

DSTUNE = str(Path(sys.executable).with_name("dstune"))
TOKEN = "script-job-token"
WORKLOAD = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "seq_len": 128}
SCRIPT = (
    "import pathlib, sys\npathlib.Path(__file__).with_name('ran.txt').write_text('ran')\nsys.exit('boom: own error')\n"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A training script that leaves a mark when it runs, its ds_config, and a job file beside."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    (folder / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    (tmp_path / "job.json").write_text(json.dumps({"workload": WORKLOAD, "trials": 1, "launcher": "local"}))
    return folder


def _queue(project: Path, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    args = ["queue", str(project.parent / "job.json"), "--storage", db, "--", "python", "train.py", "--deepspeed"]
    result = CliRunner().invoke(app, [*args, "ds.json"])
    assert result.exit_code == 0, result.output


def _worker(db: str, *trust: Path) -> subprocess.CompletedProcess[str]:
    allow = [arg for folder in trust for arg in ("--allow-scripts", str(folder))]
    command = [DSTUNE, "worker", "--once", "--storage", db, "--launcher", "local", *allow]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow  # three workers, one running the command
def test_a_worker_runs_a_queued_command_only_inside_a_folder_it_trusts(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    other = tmp_path / "other"
    other.mkdir()
    for trust, reason in [((), "--allow-scripts"), ((other,), "outside the trusted folders")]:
        _queue(project, db, monkeypatch)
        _worker(db, *trust)
        job = Store.open(db).list_jobs()[0]
        assert job.status == "failed" and reason in (job.error or ""), job.error
        assert not (project / "ran.txt").exists()  # nothing of the command ran
    _queue(project, db, monkeypatch)
    _worker(db, project)
    job = Store.open(db).list_jobs()[0]
    assert (project / "ran.txt").exists() and "boom: own error" in (job.error or ""), job.error


def test_the_api_queues_no_job_with_a_command_and_shows_none_without_the_token(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'api.db'}"
    script = {"argv": ["python", "-c", "import os; os.system('id')"], "cwd": "/tmp"}
    with TestClient(create_app(db, TOKEN)) as client:
        answer = client.post(
            "/v1/jobs", json={"workload": WORKLOAD, "script": script}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert answer.status_code == 403 and "dstune queue" in answer.json()["detail"], answer.text
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json() == []
        _queue(project, db, monkeypatch)  # queued where the database is
        shown = client.get("/v1/jobs").json()[0]["request"]
        assert shown["script"] == "<command>" and str(project) not in json.dumps(shown)
        full = client.get("/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json()[0]["request"]
        assert full["script"]["argv"] == ["python", "train.py", "--deepspeed", "ds.json"]


def test_queue_takes_the_command_after_the_separator_only(project: Path, tmp_path: Path) -> None:
    job = tmp_path / "with_script.json"
    job.write_text(json.dumps({"workload": WORKLOAD, "script": {"argv": ["python", "x.py"], "cwd": str(project)}}))
    result = CliRunner().invoke(app, ["queue", str(job), "--storage", f"sqlite:///{tmp_path / 'q.db'}"])
    assert result.exit_code == 2 and "script" in result.stderr and "after --" in result.stderr


def test_a_queued_command_without_a_model_is_studied_as_tune_studies_it(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dstune queue JOB.json -- <command>`` whose workload names no model: queued, and the worker's study has the
    command's own (unknown) model: nothing estimated nor pruned, recorded as such, tokens/s only from what it saw."""
    from tuner.requests import JobRequest
    from tuner.study.settings import NO_MODEL_NOTE
    from tuner.worker.study_job import study_settings

    db = f"sqlite:///{tmp_path / 'own.db'}"
    own = {"gpus": 2, "device": "cpu"}
    (tmp_path / "job.json").write_text(json.dumps({"workload": own, "trials": 1, "launcher": "local"}))
    monkeypatch.chdir(project)
    args = ["queue", str(tmp_path / "job.json"), "--storage", db, "--", "python", "train.py", "--deepspeed", "ds.json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "no --model: dstune cannot estimate" in result.stderr
    job = Store.open(db).list_jobs()[0]
    request = JobRequest.model_validate(job.request)
    assert all(job.request["workload"].get(key) is None for key in ("model", "config", "params"))
    settings = study_settings(request, job.study_name, trusted=[project])
    assert settings.workload.model.is_unknown and settings.workload.model.n_params == 0
    assert job.study_name.startswith("command-")  # named by the command, as tune names it
    assert settings.to_record()["no_model"] == NO_MODEL_NOTE and not settings.dispatch.seq_len_known
    assert settings.workload.cluster.world_size == 2 and settings.workload.train.precision == "bf16"  # its ds.json's
    # a sequence length given: tokens per sample known, as tune --seq-len
    (tmp_path / "job.json").write_text(json.dumps({"workload": {**own, "seq_len": 64}, "trials": 1}))
    assert CliRunner().invoke(app, args).exit_code == 0
    given = JobRequest.model_validate(Store.open(db).list_jobs()[0].request)
    assert study_settings(given, "g", trusted=[project]).dispatch.seq_len_known and given.workload.seq_len == 64
    # a field that describes a model is refused without one, naming it (exit 2, nothing queued)
    (tmp_path / "job.json").write_text(json.dumps({"workload": {**own, "freeze": "embed"}, "trials": 1}))
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "freeze" in refused.stderr and "give the workload a model" in refused.stderr
    assert len(Store.open(db).list_jobs()) == 2
