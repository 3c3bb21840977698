"""A global batch the ranks cannot split is refused where it is typed: ``dstune tune --global-batch`` before the
study is created (no empty study left behind), ``dstune queue`` and ``POST /v1/jobs`` before the job is queued (not
by the worker, later)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.requests import FieldError
from tuner.requests.job import JobRequest, check_job
from tuner.storage import Store

runner = CliRunner()
WORKLOAD = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "gpu_memory": "64MiB", "seq_len": 128}


def test_a_job_whose_global_batch_the_ranks_cannot_split_is_refused_naming_it() -> None:
    with pytest.raises(FieldError) as raised:
        check_job(JobRequest(workload=WORKLOAD, global_batch=15, trials=2))
    assert raised.value.loc == ("global_batch",)
    assert "15" in raised.value.message and "2" in raised.value.message
    assert check_job(JobRequest(workload=WORKLOAD, global_batch=16, trials=2))  # a multiple is queued


def test_queue_refuses_it_exit_2_and_queues_nothing(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"workload": WORKLOAD, "global_batch": 15, "trials": 2, "launcher": "local"}))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    result = runner.invoke(app, ["queue", str(job), "--storage", url])
    assert result.exit_code == 2, result.output
    assert "global_batch" in result.output and "Traceback" not in result.output
    assert Store.open(url).list_jobs() == []


def test_tune_refuses_it_exit_2_before_creating_the_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    args = ["tune", "--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--gpu-memory", "64MiB"]
    result = runner.invoke(app, [*args, "--global-batch", "15", "--trials", "1", "--study", "gb", "--storage", url])
    assert result.exit_code == 2, result.output
    assert "global_batch" in result.output
    assert Store.open(url).get_study("gb") is None
    assert "gb" not in optuna.get_all_study_names(url)
