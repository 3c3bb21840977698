"""``dstune worker``: take queued tuning jobs from the database and run each.

Several workers may share one queue: :meth:`tuner.storage.Store.claim_next_job` hands every job to exactly one of them
(row locks with ``SKIP LOCKED`` on PostgreSQL, the database write lock on SQLite). Each claimed job is leased and
heartbeated (:mod:`tuner.worker.lease`) and run by an executor, :func:`~tuner.worker.study_job.run_study_job` by
default; how it ended is recorded on the job unless its lease was lost. While the database is out of reach, the worker
waits for it; a job that failed for that reason is left to its lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tuner.storage import DatabaseUnavailable, JobRecord, Store, StoreError, is_disconnect
from tuner.worker.lease import Heartbeat, JobHandle, default_lease_s, default_worker_name
from tuner.worker.study_job import run_study_job

_log = logging.getLogger(__name__)

Executor = Callable[[Store, JobRecord, JobHandle], str]
"""Runs one claimed job; returns ``"done"``, ``"cancelled"`` or ``"interrupted"`` (the worker itself was stopped);
an exception fails the job."""


def run_claimed(store: Store, job: JobRecord, executor: Executor, lease_s: float | None = None) -> str:
    """Run a job this worker holds (status running) and record how it ended; returns that status, or ``"lost"``
    (another worker took the job over; nothing recorded) or ``"unavailable"`` (the database went away; the job is
    left to its lease). A job claimed with a lease has it renewed by a :class:`Heartbeat` (every ``lease_s / 4``)."""
    _log.info("job %s: started, study %s", job.id, job.study_name)
    heartbeat = None
    if job.lease_expires_at is not None and job.worker:
        heartbeat = Heartbeat(store, job.id, job.worker, lease_s or default_lease_s())
        heartbeat.start()
    handle = JobHandle(store, job.id, heartbeat)
    holder = job.worker if heartbeat is not None else None
    try:
        try:
            outcome = executor(store, job, handle)
        except Exception as error:  # any failure of the job is the job's, not the worker's: record it and go on
            if isinstance(error, DatabaseUnavailable) or is_disconnect(error):  # Optuna's storage gave up too
                _log.error("job %s: database unavailable (%s); the job is left to its lease", job.id, error)
                return "unavailable"
            return _finish(store, job.id, "failed", f"{type(error).__name__}: {error}", holder)
        finally:
            if heartbeat is not None:
                heartbeat.stop()
        if handle.lease_lost:
            return "lost"
        if outcome == "interrupted":
            stopped = "interrupted: the worker was stopped; finished trials are recorded"
            _finish(store, job.id, "failed", stopped, holder)
            raise KeyboardInterrupt
        status = "cancelled" if outcome == "cancelled" else "done"
        return _finish(store, job.id, status, "cancelled on request" if status == "cancelled" else None, holder)
    finally:
        if heartbeat is not None:
            heartbeat.join(timeout=5)


def _finish(store: Store, job_id: int, status: str, error: str | None, holder: str | None) -> str:
    """Finish the job if this worker still holds it (``holder``; None: unchecked); ``"lost"`` when it does not,
    ``"unavailable"`` when the database cannot be reached (the job is then left to its lease)."""
    try:
        store.finish_job(job_id, status, error, worker=holder)
    except DatabaseUnavailable as unavailable:  # the job stays running: its lease passes and it is taken over
        _log.error("job %s: could not record it %s: %s", job_id, status, unavailable)
        return "unavailable"
    except StoreError as lost:
        if lost.field != "worker":
            raise
        return "lost"
    _log.info("job %s: %s%s", job_id, status, f" ({error})" if error else "")
    return status


def work(
    store: Store,
    name: str | None = None,
    executor: Executor = run_study_job,
    *,
    once: bool = False,
    poll: float = 5.0,
    stop: threading.Event | None = None,
    lease_s: float | None = None,
) -> list[int]:
    """Claim and run jobs until ``stop`` is set (or, with ``once``, until the queue is empty); returns the ids of the
    jobs this worker ran. Each job is leased for ``lease_s`` (default :func:`default_lease_s`) and heartbeated; jobs
    whose worker died (lease passed) are taken over. A database out of reach is waited for (with ``once`` it ends
    the loop with :class:`DatabaseUnavailable`)."""
    name = name or default_worker_name()
    stop = stop or threading.Event()
    lease_s = lease_s or default_lease_s()
    ran: list[int] = []
    while not stop.is_set():
        try:
            job = store.claim_next_job(name, lease_s=lease_s)
        except DatabaseUnavailable as error:
            if once:
                raise
            _log.warning("worker %s: %s; waiting for it", name, error)
            stop.wait(poll)
            continue
        if job is None:
            if once:
                break
            stop.wait(poll)
            continue
        ran.append(job.id)
        run_claimed(store, job, executor, lease_s)
    return ran


def run_job(store: Store, job_id: int, executor: Executor = run_study_job, lease_s: float | None = None) -> str:
    """Run one job by id (``dstune worker --job ID``, what a Ray submission runs). A queued job (or one whose worker
    died: lease passed) is claimed; a job the submitting worker holds is handed over to this one (the lease passes
    here, and this worker's heartbeat renews it); a job held without a lease is run as it is."""
    job = store.get_job(job_id)
    if job is None:
        raise StoreError("job", f"no job {job_id}")
    lease_s = lease_s or default_lease_s()
    name = default_worker_name()
    if job.status in ("running", "cancel_requested") and job.lease_expires_at is None:
        return run_claimed(store, job, executor, lease_s)
    if job.status not in ("queued", "running", "cancel_requested"):
        raise StoreError("job", f"job {job_id} is {job.status}")
    claimed = None
    if job.status != "queued" and job.worker:
        claimed = store.renew_lease(job_id, job.worker, lease_s, new_worker=name)
    claimed = claimed or store.claim_job(job_id, name, lease_s=lease_s)
    if claimed is None:
        raise StoreError("job", f"job {job_id} was taken by another worker")
    return run_claimed(store, claimed, executor, lease_s)
