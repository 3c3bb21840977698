"""The job queue (store methods + ``tuner.worker``) on SQLite and PostgreSQL: claims, races, cancellation."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from postgres import postgres_url  # noqa: F401  (a fixture)

from tuner.requests import JobRequest, WorkloadInput, WorkloadRequest, check_job
from tuner.storage import JobRecord, Store, StoreError
from tuner.worker import JobHandle, run_job, work


def request_json(**change: object) -> dict:
    base = {"workload": {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": "64MiB", "seq_len": 64}}
    return JobRequest.model_validate({**base, **change}).model_dump(mode="json")


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def run_threads(threads: list[threading.Thread]) -> None:
    """Start and join ``threads``; an exception in any of them fails the test."""
    errors: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,return-value]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        threading.excepthook = previous
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)


def test_queue_contract(store: Store) -> None:
    first = store.enqueue_job("a", request_json())
    second = store.enqueue_job("b", request_json())
    assert first.status == "queued" and first.worker is None and first.request["workload"]["model"] == "tiny-gpt2"
    claimed = store.claim_next_job("w1")
    assert claimed is not None and claimed.id == first.id and claimed.status == "running" and claimed.worker == "w1"
    assert claimed.started_at is not None
    assert store.update_job_progress(first.id, {"trials": 3}).progress == {"trials": 3}
    merged = store.update_job_progress(first.id, {"trials": 2, "ray_submission_id": "r1"}).progress
    assert merged == {"trials": 2, "ray_submission_id": "r1"}
    assert store.update_job_progress(first.id, {"trials": 3}).progress == {"trials": 3, "ray_submission_id": "r1"}
    assert store.cancel_job(second.id).status == "cancelled"  # queued: at once
    assert store.claim_next_job("w2") is None  # nothing queued is left
    assert store.cancel_job(first.id).status == "cancel_requested"  # running: the worker stops it
    assert store.update_job_progress(first.id, {"trials": 4}).status == "cancel_requested"
    done = store.finish_job(first.id, "cancelled", "cancelled on request")
    assert done.status == "cancelled" and done.finished_at is not None
    assert store.cancel_job(first.id).status == "cancelled"  # finished: unchanged
    assert [j.id for j in store.list_jobs()] == [second.id, first.id]
    assert [j.id for j in store.list_jobs(status="cancelled", limit=1)] == [second.id]
    assert store.get_job(12345) is None
    with pytest.raises(StoreError):
        store.cancel_job(12345)
    with pytest.raises(StoreError):
        store.finish_job(first.id, "queued")


def test_a_job_row_locked_by_a_stalled_transaction_is_taken_over_once_the_server_ends_it(
    postgres_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker stopped (SIGSTOP) while it renewed its lease holds its job row's lock; claims skip locked rows, so the
    job stayed out of every other worker's reach for good (a failure CI saw). The server ends a session idle in a
    transaction past ``DSTUNE_DB_IDLE_TX_S``, after which the job is taken over; the stalled session is gone."""
    import sqlalchemy as sa

    from tuner.storage.tables import JobRow

    monkeypatch.setenv("DSTUNE_DB_IDLE_TX_S", "1")
    with Store.open(postgres_url) as store:
        job = store.enqueue_job("stalled", request_json())
        assert store.claim_next_job("stopped", lease_s=0.1) is not None
        with store.engine.connect() as stalled:
            stalled.begin()  # the stopped worker's transaction: it locked its row, then never went on
            stalled.execute(sa.select(JobRow.id).where(JobRow.id == job.id).with_for_update())
            taken: list[JobRecord] = []
            wait_for(lambda: taken.append(store.claim_next_job("rescuer")) or taken[-1] is not None, 60)
            assert taken[-1].id == job.id and taken[-1].worker == "rescuer" and taken[-1].attempts == 2
            assert taken[-1].progress["lease_expired"]["worker"] == "stopped"
            with pytest.raises(sa.exc.DBAPIError):
                stalled.execute(sa.text("SELECT 1"))  # the server ended the stalled session


def test_two_workers_racing_take_each_job_once(url: str) -> None:
    """Two workers, each with its own Store (own connections), drain a queue of 10 jobs: every job runs once."""
    with Store.open(url) as setup:
        ids = [setup.enqueue_job(f"s{i}", request_json()).id for i in range(10)]
    runs: list[tuple[int, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(2)

    def executor(store: Store, job: JobRecord, handle: JobHandle) -> str:
        with lock:
            runs.append((job.id, job.worker or ""))
        time.sleep(0.01)  # hold the job a moment, so the other worker claims meanwhile
        return "done"

    stores = [Store(url) for _ in range(2)]  # separate engines and connections, as separate processes have

    def worker(own: Store, name: str) -> None:
        start.wait(timeout=30)
        work(own, name, executor, once=True)

    run_threads([threading.Thread(target=worker, args=(stores[i], f"w{i}")) for i in range(2)])
    for own in stores:
        own.close()
    counts = Counter(job_id for job_id, _ in runs)
    assert sorted(counts) == ids and set(counts.values()) == {1}, counts
    with Store.open(url) as check:
        jobs = {job.id: job for job in check.list_jobs()}
    assert all(jobs[i].status == "done" for i in ids)
    assert all(jobs[job_id].worker == name for job_id, name in runs)  # the row names who ran it


def test_claims_from_many_threads_never_collide(url: str) -> None:
    """Harder race: 4 stores × 25 claim attempts on 40 jobs, no executor in between."""
    with Store.open(url) as setup:
        ids = [setup.enqueue_job(f"s{i}", request_json()).id for i in range(40)]
    claimed: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    stores = [Store(url) for _ in range(4)]

    def claimer(own: Store, name: str) -> None:
        start.wait(timeout=30)
        for _ in range(25):
            job = own.claim_next_job(name)
            if job is not None:
                with lock:
                    claimed.append(job.id)

    run_threads([threading.Thread(target=claimer, args=(stores[i], f"c{i}")) for i in range(4)])
    for own in stores:
        own.close()
    assert sorted(claimed) == ids


def test_cancelling_a_running_job_stops_it_between_steps(store: Store) -> None:
    """An executor that reports progress after each step stops when the job is cancelled; the job ends cancelled
    with the progress it had reached (the injected executor stands for the study; see the next test)."""
    job = store.enqueue_job("long", request_json(trials=1000))
    steps: list[int] = []

    def executor(store: Store, job: JobRecord, handle: JobHandle) -> str:
        for step in range(1000):
            steps.append(step)
            if handle.report({"trials": step + 1, "budget": 1000}):
                return "cancelled"
            time.sleep(0.01)
        return "done"

    stop = threading.Event()
    thread = threading.Thread(target=work, args=(store, "w1", executor), kwargs={"stop": stop, "poll": 0.05})
    thread.start()
    wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 3)
    assert store.cancel_job(job.id).status == "cancel_requested"
    wait_for(lambda: store.get_job(job.id).status == "cancelled")
    stop.set()
    thread.join(timeout=30)
    final = store.get_job(job.id)
    assert final.error == "cancelled on request" and final.finished_at is not None
    assert 3 <= final.progress["trials"] < 1000 and len(steps) == final.progress["trials"]


def test_failing_job_is_marked_failed_and_the_worker_goes_on(store: Store) -> None:
    bad = store.enqueue_job("bad", request_json())
    good = store.enqueue_job("good", request_json())

    def executor(store: Store, job: JobRecord, handle: JobHandle) -> str:
        if job.id == bad.id:
            raise RuntimeError("boom")
        return "done"

    assert work(store, "w", executor, once=True) == [bad.id, good.id]
    assert store.get_job(bad.id).status == "failed" and "RuntimeError: boom" in store.get_job(bad.id).error
    assert store.get_job(good.id).status == "done"


def start_study_job(
    store: Store, study: str, gpu_memory: str, **settings: object
) -> tuple[JobRecord, threading.Event, threading.Thread]:
    """Queue a real study job of tiny-gpt2 on CPU (local launcher, random sampler, seed 1) and start a worker thread
    on the queue; returns the job, the worker's stop event and its thread."""
    workload = {"model": "tiny-gpt2", "device": "cpu", "gpu_memory": gpu_memory, "seq_len": 64}
    body = {"workload": workload, "launcher": "local", "sampler": "random", "seed": 1, "global_batch": 8}
    request = JobRequest.model_validate({**body, "study": study, **settings})
    job = store.enqueue_job(check_job(request), request.model_dump(mode="json"))
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(store, "w1"), kwargs={"stop": stop, "poll": 0.05})
    thread.start()
    return job, stop, thread


def test_real_study_job_runs_and_cancels_cleanly(store: Store) -> None:
    """The default executor on a real TuningStudy: a workload whose every config is pruned by the estimator (no
    measured runs, so it is fast), a budget far too large to finish; cancelling stops it between trials, the study's
    trials are all recorded and none is left running."""
    job, stop, thread = start_study_job(store, "cancel-me", gpu_memory="1MiB", trials=2000)
    wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 5, timeout=120)
    store.cancel_job(job.id)
    wait_for(lambda: store.get_job(job.id).status not in ("running", "cancel_requested"), timeout=120)
    stop.set()
    thread.join(timeout=60)
    final = store.get_job(job.id)
    assert final.status == "cancelled", final.error
    study = store.get_study("cancel-me")
    trials = store.trials(study.id)
    assert 5 <= len(trials) < 2000
    assert {t.status for t in trials} == {"pruned"}
    assert final.progress["counts"]["pruned"] == len(trials) and final.progress["study_id"] == study.id


@pytest.mark.deepspeed
def test_cancelling_during_a_measured_run_kills_it(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real study job whose first trial is a long measured run (real DeepSpeed ranks): cancelling it kills the
    ranks at once instead of waiting for the run to end; that trial is recorded failed as cancelled, and the job ends
    cancelled with no rank process left behind."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("deepspeed")
    # 10,000 timed steps: minutes of training if the run were not killed
    job, stop, thread = start_study_job(
        store, "cancel-measured", gpu_memory="64GiB", trials=5, steps=10_000, run_timeout=1800
    )

    from faultkit import MARKER_ENV, marked_processes, rank_processes

    marker = f"dstune-jobs-{uuid.uuid4().hex}"  # ranks are the node's fork server's children: found by marker
    monkeypatch.setenv(MARKER_ENV, marker)

    def ranks() -> list:
        return rank_processes(marked_processes(marker))

    try:
        wait_for(lambda: ((store.get_job(job.id).progress or {}).get("last") or {}).get("status") == "running", 120)
        wait_for(lambda: len(ranks()) == 1, 60)
        running = ranks()
        time.sleep(3)  # the rank is importing torch / starting DeepSpeed: cancel mid-run
        cancelled_at = time.monotonic()
        store.cancel_job(job.id)
        wait_for(lambda: store.get_job(job.id).status not in ("running", "cancel_requested"), 60)
        assert time.monotonic() - cancelled_at < 20
    finally:
        stop.set()
        thread.join(timeout=120)
    final = store.get_job(job.id)
    assert final.status == "cancelled", final.error
    trials = store.trials(store.get_study("cancel-measured").id)
    killed = [t for t in trials if t.status == "failed"]
    assert len(killed) == 1 and killed[0].error == "cancelled: the study was stopped"
    assert not any(t.status in ("running", "pending") for t in trials)
    assert not any(process.is_running() and process.status() != psutil.STATUS_ZOMBIE for process in running)


def test_run_job_by_id_claims_that_job(store: Store) -> None:
    older = store.enqueue_job("older", request_json())
    target = store.enqueue_job("target", request_json())
    seen: list[int] = []

    def executor(store: Store, job: JobRecord, handle: JobHandle) -> str:
        seen.append(job.id)
        return "done"

    assert run_job(store, target.id, executor) == "done"
    assert seen == [target.id] and store.get_job(older.id).status == "queued"
    with pytest.raises(StoreError):
        run_job(store, target.id, executor)  # finished: not run again
    taken = store.claim_job(older.id, "w2")  # claiming one job by id: once, and only while it is queued
    assert taken is not None and taken.status == "running" and taken.worker == "w2"
    assert store.claim_job(older.id, "w3") is None and store.claim_job(target.id, "w3") is None


def test_a_queued_commands_study_stops_by_the_rule_tune_gives_a_command(tmp_path: Path) -> None:
    """A job with a training command gets `dstune tune -- <command>`'s --patience default; dstune's own trainer's job
    none (every trial of its budget runs, as before)."""
    from tuner.requests.script_job import ScriptJob
    from tuner.study import SCRIPT_PATIENCE
    from tuner.worker import study_settings

    command = ScriptJob(argv=["python", "train.py", "--deepspeed", "ds.json"], cwd=str(tmp_path))
    workload = WorkloadInput(model="gpt2", gpus=2, seq_len=64, device="cpu")
    scripted = study_settings(JobRequest(workload=workload, script=command), "s", trusted=[tmp_path])
    assert scripted.patience == SCRIPT_PATIENCE
    assert study_settings(JobRequest(workload=workload), "t").patience is None


def test_job_request_round_trips_to_study_settings() -> None:
    from tuner.worker import study_settings

    request = JobRequest(
        workload=WorkloadInput(model="gpt2", gpus=4, seq_len=1024, micro_batch=8), trials=5, launcher="local"
    )
    settings = study_settings(request, "s", ray_address="ray://head:10001")
    assert settings.trials == 5 and settings.dispatch.launcher == "local"
    assert settings.dispatch.ray_address == "ray://head:10001"
    assert not hasattr(settings.workload.train, "micro_batch")  # the search decides it: the trial config's
    assert (
        settings.workload
        == study_settings(JobRequest(workload=WorkloadRequest(model="gpt2", gpus=4, seq_len=1024)), "t").workload
    )
    assert settings.workload.cluster.world_size == 4
