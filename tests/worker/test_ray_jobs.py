"""``dstune worker --submit`` against a real Ray cluster: a local head started with ``ray start`` (dashboard and Jobs
API on), jobs queued in a SQLite file, run on the cluster as ``dstune worker --job ID`` and followed by
:func:`tuner.worker.submit_loop` until they end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed: the Ray Jobs API path cannot be tested")

from ray.job_submission import JobStatus, JobSubmissionClient

from tuner.requests import JobRequest, check_job
from tuner.storage import JobRecord, Store
from tuner.worker import STORAGE_ENV, follow_submission, running_submissions, submit_loop, submit_to_ray

BIN = Path(sys.executable).parent  # the venv's bin: ray, and dstune for the jobs' entrypoints


@dataclass(frozen=True)
class RayHead:
    address: str  # the Jobs API (dashboard), http://127.0.0.1:PORT
    client: JobSubmissionClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_members(session_id: int) -> list[int]:
    """Pids of the live processes in session ``session_id`` (``ray start`` and everything it started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session_id and fields[0] != "Z":  # fields after the name: state ppid pgrp session
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    """A one-node Ray cluster (2 CPUs) with its own temp folder and ports, in its own session so that teardown can
    stop exactly its processes (never ``ray stop``, which would also end other tests' local Rays)."""
    temp_dir = tempfile.mkdtemp(prefix="dstune-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    dashboard_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    command = [
        str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats", "--num-cpus", "2",
        "--port", str(free_port()), "--ray-client-server-port", str(free_port()),
        "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        "--dashboard-agent-listen-port", str(free_port()), "--temp-dir", temp_dir,
    ]  # fmt: skip
    with open(Path(temp_dir) / "ray-start.log", "wb") as log:
        head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        client = wait_for_job_server(head, address, Path(temp_dir) / "ray-start.log")
        yield RayHead(address, client)
    finally:
        stop_head(head, address)
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for_job_server(head: subprocess.Popen, address: str, log: Path, timeout: float = 60) -> JobSubmissionClient:
    """A client of the head's Jobs API once it answers (about 6 s after ``ray start`` here)."""
    deadline = time.monotonic() + timeout
    while True:
        assert head.poll() is None, f"ray start exited {head.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no Ray job server at {address} after {timeout} s"
        try:
            urllib.request.urlopen(f"{address}/api/version", timeout=2).close()
            client = JobSubmissionClient(address)
            client.list_jobs()
            return client
        except OSError:
            time.sleep(0.3)


def stop_head(head: subprocess.Popen, address: str) -> None:
    """Stop the jobs still going, then the head (SIGTERM, which ``--block`` turns into a clean shutdown), then kill
    whatever of its session is left."""
    try:
        client = JobSubmissionClient(address)
        for job in client.list_jobs():
            if not job.status.is_terminal() and job.submission_id:
                client.stop_job(job.submission_id)
    except Exception:  # the head is already gone: nothing to stop through it
        pass
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=20)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    deadline = time.monotonic() + 10
    while (left := session_members(head.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, signal.SIGKILL)


def enqueue(store: Store, study: str, trials: int = 3, gpu_memory: str = "1MiB", **settings: object) -> JobRecord:
    """A job of tiny-gpt2 on CPU; by default one whose every config the estimator prunes (1 MiB of device memory):
    no measured run, so it is quick."""
    request = JobRequest.model_validate(
        {
            "workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": gpu_memory, "seq_len": 64},
            "trials": trials,
            "launcher": "ray",
            "sampler": "random",
            "seed": 1,
            "global_batch": 8,
            "study": study,
            **settings,
        }
    )
    return store.enqueue_job(check_job(request), request.model_dump(mode="json"))


def test_a_submitted_job_runs_on_the_cluster(ray_head: RayHead, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    with Store.open(url) as store:
        job = enqueue(store, "on-the-cluster")
        assert submit_loop(store, ray_head.address, url, once=True, poll=0.5, timeout=60) == [job.id]
        final = store.get_job(job.id)
        assert final is not None and final.status == "done", final and final.error
        submission_id = final.progress["ray_submission_id"]
        assert final.progress["ray_status"] == "SUCCEEDED" and final.progress["counts"]["pruned"] == 3
        study = store.get_study("on-the-cluster")
        assert study is not None and [t.status for t in store.trials(study.id)] == ["pruned"] * 3
    assert ray_head.client.get_job_status(submission_id) == JobStatus.SUCCEEDED
    assert f"job {job.id}: done" in ray_head.client.get_job_logs(submission_id)  # dstune's last line, on the cluster


@pytest.mark.deepspeed
def test_a_submitted_job_measures_its_trial_on_the_cluster(ray_head: RayHead, tmp_path: Path) -> None:
    """End to end on the cluster: the submitted ``dstune worker --job`` runs a study whose trial is measured by the
    Ray launcher on that same cluster (real DeepSpeed ranks placed by Ray), and the measurement lands in the
    database the submitter reads."""
    pytest.importorskip("deepspeed")
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    with Store.open(url) as store:
        job = enqueue(store, "measured-on-the-cluster", trials=1, gpu_memory="64GiB", warmup=1, steps=2)
        assert submit_loop(store, ray_head.address, url, once=True, poll=0.5, timeout=240) == [job.id]
        final = store.get_job(job.id)
        assert final is not None and final.status == "done", final and final.error
        trials = store.trials(store.get_study("measured-on-the-cluster").id)
    assert [t.status for t in trials] == ["ok"], [(t.status, t.error) for t in trials]
    assert trials[0].tokens_per_s > 0
    assert final.progress["best_tokens_per_s"] == trials[0].tokens_per_s


def test_a_restarted_submitter_follows_what_was_submitted_before(ray_head: RayHead, tmp_path: Path) -> None:
    """A job submitted by a submitter that then died (submit_to_ray alone, nobody following) is picked up by the next
    submit loop on the same cluster from what the database holds, and followed to its end."""
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    with Store.open(url) as store:
        job = enqueue(store, "adopted")
        claimed = store.claim_next_job("submitter-that-died")
        submission_id = submit_to_ray(store, claimed, ray_head.address, url)
        assert running_submissions(store, ray_head.address) == {job.id: submission_id}
        assert running_submissions(store, "http://elsewhere:8265") == {}
        assert submit_loop(store, ray_head.address, url, once=True, poll=0.5, timeout=60) == []
        final = store.get_job(job.id)
    assert final is not None and final.status == "done", final and final.error
    assert final.progress["ray_submission_id"] == submission_id and final.progress["ray_status"] == "SUCCEEDED"


def test_a_job_whose_ray_entrypoint_crashes_fails_with_the_ray_logs(ray_head: RayHead, tmp_path: Path) -> None:
    """The Ray job is given a database it cannot open (a folder that does not exist): ``dstune worker --job`` dies
    before touching the job, which only the submitting worker can then fail."""
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    unreachable = f"sqlite:///{tmp_path / 'no-such-folder' / 'dstune.db'}"
    with Store.open(url) as store:
        job = enqueue(store, "crashes")
        assert submit_loop(store, ray_head.address, unreachable, once=True, poll=0.5, timeout=60) == [job.id]
        final = store.get_job(job.id)
    assert final is not None and final.status == "failed" and final.error is not None
    submission_id = final.progress["ray_submission_id"]
    assert final.progress["ray_status"] == "FAILED"
    assert final.error.startswith(f"Ray job {submission_id} ended FAILED (")
    assert "while the dstune job was running" in final.error
    assert "exit code 1" in final.error and "unable to open database file" in final.error  # from the log tail
    assert len(final.error) < 2500
    assert ray_head.client.get_job_status(submission_id) == JobStatus.FAILED


def test_a_job_cancelled_before_its_ray_job_starts_ends_cancelled(ray_head: RayHead, tmp_path: Path) -> None:
    """A Ray job that cannot start (its entrypoint asks for a resource no node has, so it stays PENDING), submitted
    like :func:`tuner.worker.submit_to_ray` does, then cancelled: the job ends cancelled at once and Ray is asked to
    stop it (Ray acts on that when the job's supervisor starts, here never: the fixture's teardown ends it)."""
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    client = ray_head.client
    with Store.open(url) as store:
        job = enqueue(store, "never-starts")
        assert store.claim_next_job("submitter") is not None
        submission_id = client.submit_job(
            entrypoint=f"dstune worker --job {job.id}",
            entrypoint_resources={"no_such_node": 1},
            runtime_env={"env_vars": {STORAGE_ENV: url}},
        )
        assert not follow_submission(store, client, job.id, submission_id)  # pending, not cancelled: left alone
        assert store.get_job(job.id).status == "running"
        assert store.cancel_job(job.id).status == "cancel_requested"
        assert follow_submission(store, client, job.id, submission_id)
        final = store.get_job(job.id)
    assert final is not None and final.status == "cancelled"
    assert final.error == f"cancelled on request before Ray job {submission_id} started"
    assert final.progress == {"ray_submission_id": submission_id, "ray_status": "PENDING"}
    assert client.get_job_status(submission_id) == JobStatus.PENDING
