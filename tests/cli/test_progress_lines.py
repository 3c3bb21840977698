"""Progress where output is not a terminal: ``dstune tune`` sent to a file prints one line per trial (the live bar
shows nothing there), and ``dstune worker`` logs each job it starts and ends and each of its trials, which is what a
file or systemd's journal holds. Studies whose every config the estimator prunes (1 MiB of GPU memory): no run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.requests import JobRequest, check_job
from tuner.storage import Store

runner = CliRunner()
WORKLOAD = ["--model", "tiny-gpt2", "--device", "cpu", "--seq-len", "64", "--gpu-memory", "1MiB"]


def test_tune_to_a_file_prints_one_line_per_trial(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ["tune", *WORKLOAD, "--trials", "3", "--sampler", "random", "--seed", "1", "--study", "s"]
    result = runner.invoke(app, [*args, "--storage", storage, "--launcher", "local"])
    lines = [line for line in result.stdout.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3, result.output
    assert all(": pruned · ZeRO-" in line and "needs" in line for line in lines), lines


def test_the_worker_logs_each_job_and_each_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    body = {"workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": "1MiB", "seq_len": 64}}
    request = JobRequest.model_validate({**body, "launcher": "local", "sampler": "random", "seed": 1, "trials": 2})
    job = Store.open(url).enqueue_job(check_job(request), request.model_dump(mode="json"))
    dstune = str(Path(sys.executable).with_name("dstune"))
    result = subprocess.run(
        [dstune, "worker", "--once", "--storage", url], capture_output=True, text=True, timeout=600, env=os.environ
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    assert f"job {job.id}: started, study " in log
    assert log.count(f"job {job.id}: trial ") == 2 and ": pruned · ZeRO-" in log, log
    assert f"job {job.id}: done" in log and "ran 1 job(s)" in result.stdout


def test_a_job_is_queued_from_the_cli_and_a_bad_field_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    job = tmp_path / "job.json"
    body = {"workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": "1MiB", "seq_len": 64}, "trials": 2}
    job.write_text(json.dumps({**body, "study": "queued"}))
    result = runner.invoke(app, ["queue", str(job), "--storage", url])
    assert result.exit_code == 0 and "queued job 1 (study queued)" in result.stdout, result.output
    assert Store.open(url).get_job(1).status == "queued"
    job.write_text(json.dumps({**body, "trials": 0}))
    bad = runner.invoke(app, ["queue", str(job), "--storage", url])
    assert bad.exit_code == 2 and "error: trials:" in bad.stderr and bad.stderr.count("\n") == 1, bad.output
