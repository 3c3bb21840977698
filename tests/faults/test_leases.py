"""Job leases on SQLite and PostgreSQL: a job is held only while its worker heartbeats; a dead (SIGKILLed) or stalled
(SIGSTOPped) worker's job is taken over by the next worker and its study resumes; two workers never run one job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from faultkit import pruned_job_request, wait_for

from tuner.storage import MAX_ATTEMPTS, JobRecord, Store, StoreError
from tuner.worker import JobHandle, work

WORKER = Path(__file__).with_name("worker_proc.py")


def test_an_expired_lease_is_taken_over_and_a_live_one_is_not(store: Store) -> None:
    job = store.enqueue_job("s", {})
    first = store.claim_next_job("w1", lease_s=1.0)
    assert first is not None and first.attempts == 1 and first.lease_expires_at is not None
    assert store.claim_next_job("w2", lease_s=1.0) is None  # held
    assert store.renew_lease(job.id, "w2") is None  # only the holder renews
    taken = wait_for(lambda: store.claim_next_job("w2", lease_s=60.0), 60, "the lease to pass")
    assert taken.id == job.id and taken.worker == "w2" and taken.attempts == 2 and taken.status == "running"
    assert taken.progress["lease_expired"]["worker"] == "w1"
    assert store.renew_lease(job.id, "w1") is None  # the old holder has lost it: its heartbeat says so
    with pytest.raises(StoreError) as lost:
        store.finish_job(job.id, "done", worker="w1")  # and it cannot finish the job either
    assert lost.value.field == "worker"
    assert store.finish_job(job.id, "done", worker="w2").status == "done"
    assert store.claim_next_job("w3") is None


def test_an_expired_job_being_cancelled_ends_cancelled_and_one_that_keeps_dying_fails(store: Store) -> None:
    cancelled = store.enqueue_job("c", {})
    assert store.claim_next_job("w1", lease_s=0.5) is not None
    store.cancel_job(cancelled.id)
    doomed = store.enqueue_job("d", {})
    holders = [f"w{i}" for i in range(MAX_ATTEMPTS)]
    for number, holder in enumerate(holders):
        claim = wait_for(lambda h=holder: store.claim_next_job(h, lease_s=0.5), 60, "a claim")  # type: ignore[misc]
        assert claim.id == doomed.id and claim.attempts == number + 1
    wait_for(lambda: store.claim_next_job("last", lease_s=0.5) is None and store.get_job(doomed.id).status == "failed")
    final = store.get_job(doomed.id)
    assert f"claimed {MAX_ATTEMPTS} times" in final.error and holders[-1] in final.error
    assert store.get_job(cancelled.id).status == "cancelled"
    assert "stopped renewing its lease" in store.get_job(cancelled.id).error


def test_the_heartbeat_holds_a_job_longer_than_its_lease(store: Store) -> None:
    """A job running for several leases is never taken over while its worker heartbeats."""
    job = store.enqueue_job("long", {})
    other = Store(store.url)
    beats: list[object] = []

    def executor(own: Store, claimed: JobRecord, handle: JobHandle) -> str:
        def renewed_thrice() -> bool:
            assert other.claim_next_job("thief", lease_s=60.0) is None
            beat = own.get_job(claimed.id).heartbeat_at
            if beat not in beats:
                beats.append(beat)
            return len(beats) >= 4  # the claim's own timestamp and three renewals

        wait_for(renewed_thrice, 120, "three heartbeats")
        return "done"

    try:
        assert work(store, "holder", executor, once=True, lease_s=1.0) == [job.id]
    finally:
        other.close()
    final = store.get_job(job.id)
    assert final.status == "done" and final.attempts == 1 and final.worker == "holder"


@pytest.fixture
def worker_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(timeout=60)


def start_worker(url: str, name: str, lease_s: float, started: list[subprocess.Popen[bytes]]) -> None:
    command = [sys.executable, str(WORKER), url, name, str(lease_s)]
    started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def check_study(url: str, study: str, budget: int) -> None:
    """The study reached its budget with nothing left running, in the store and in Optuna, no config twice."""
    with Store.open(url) as store:
        record = store.get_study(study)
        trials = store.trials(record.id)
    assert not [t for t in trials if t.status in ("running", "pending")]
    assert len({t.config_key for t in trials}) == len(trials)
    optuna_trials = optuna.load_study(study_name=study, storage=url).trials
    assert len(optuna_trials) >= budget
    assert not [t for t in optuna_trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_stalled_workers_job_is_taken_over_and_its_study_resumes(
    url: str, fault: str, worker_processes: list[subprocess.Popen[bytes]]
) -> None:
    """A worker process running a real study job is SIGKILLed (or SIGSTOPped: a hang) mid-job. A second worker takes
    the job over once the lease has passed and finishes the study; a stalled worker that wakes up finds its lease
    lost, stops its study and records nothing about the job."""
    if fault == "SIGSTOP" and url.startswith("sqlite"):
        pytest.skip("a SQLite writer stopped inside a transaction holds the file's write lock: every writer waits")
    with Store.open(url) as store:
        job = store.enqueue_job("resume", pruned_job_request("resume", trials=40))
        start_worker(url, "doomed", 2.0, worker_processes)
        wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 5, 180, "the job to run")
        os.kill(worker_processes[0].pid, getattr(signal, fault))
        stop = threading.Event()
        thread = threading.Thread(
            target=work, args=(store, "rescuer"), kwargs={"poll": 0.2, "lease_s": 2.0, "stop": stop}
        )
        thread.start()
        try:
            wait_for(lambda: store.get_job(job.id).worker == "rescuer", 180, "the take-over")
            if fault == "SIGSTOP":
                os.kill(worker_processes[0].pid, signal.SIGCONT)  # it wakes up holding nothing
            wait_for(lambda: store.get_job(job.id).status == "done", 300, "the resumed job to finish")
        finally:
            stop.set()
            thread.join(timeout=120)
        final = store.get_job(job.id)
    assert final.attempts == 2 and final.progress["lease_expired"]["worker"] == "doomed" and final.error is None
    check_study(url, "resume", budget=40)


def test_two_worker_processes_on_one_queue_run_every_job_once(
    url: str, worker_processes: list[subprocess.Popen[bytes]]
) -> None:
    with Store.open(url) as store:
        jobs = [store.enqueue_job(f"q{i}", pruned_job_request(f"q{i}", trials=4)) for i in range(6)]
        for name in ("left", "right"):
            start_worker(url, name, 30.0, worker_processes)
        wait_for(lambda: all(store.get_job(j.id).status == "done" for j in jobs), 300, "every job to finish")
        finals = [store.get_job(j.id) for j in jobs]
    assert all(job.attempts == 1 and job.worker in ("left", "right") for job in finals)
    for job in finals:
        check_study(url, job.study_name, budget=4)
