"""``dstune worker``: take queued tuning jobs from the database and run each as a study.

Several workers may share one queue: :meth:`tuner.storage.Store.claim_next_job` hands every job to exactly one of them
(row locks with ``SKIP LOCKED`` on PostgreSQL, the database write lock on SQLite). A job runs as a
:class:`tuner.study.TuningStudy` with the job's settings; its progress (trials so far, best tokens/s, the last event)
is written to the job row after every trial event, where ``GET /v1/jobs/{id}`` shows it. Cancelling a running job
(``DELETE /v1/jobs/{id}``) stops the study within about a second (``TuningStudy.run``'s ``should_stop``): no new
trial is asked, the runs in flight are killed (their ranks, locally or on Ray) and recorded failed, what finished
stays recorded, and the job ends ``cancelled``.

With ``--submit --ray-address http://HEAD:8265`` the worker does not run jobs itself: it submits each claimed job to
the Ray cluster through the Ray Jobs API, as ``dstune worker --job ID`` running on the cluster, and follows it there:
a Ray job that ends while its dstune job is still running (the entrypoint crashed) fails the job with the Ray status
and the tail of the Ray job's logs.

Leases: a claimed job is leased to its worker, and a :class:`Heartbeat` thread renews the lease every quarter of it
while the job runs (``$DSTUNE_JOB_LEASE_S``, default 60 s). A worker that is killed stops renewing; once the lease has
passed, the next worker's claim takes the job over and its study resumes (trials the dead worker left running are
failed and retried once, finished ones are kept), so no job stays ``running`` forever. A worker that finds its lease
taken (it was stalled longer than the lease) stops its study and leaves the job to the new holder. While the database
is out of reach, the worker waits for it; a job that failed for that reason is left to its lease.

The executor (what running a job means) is a parameter of :func:`work`: :func:`run_study_job` by default.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner import env
from tuner.measure.options import MeasureOptions
from tuner.requests import JobRequest, tuning_workload
from tuner.storage import DatabaseUnavailable, JobRecord, Store, StoreError, is_disconnect
from tuner.study import Event, StudySettings, TuningStudy

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

STORAGE_ENV = "DSTUNE_STORAGE"
LEASE_ENV = "DSTUNE_JOB_LEASE_S"
_log = logging.getLogger(__name__)


def study_settings(
    request: JobRequest, study_name: str, *, launcher: str | None = None, ray_address: str | None = None
) -> StudySettings:
    """The :class:`tuner.study.StudySettings` of a job (the worker may override the launcher and Ray address)."""
    from tuner.space import resolve_space

    workload = tuning_workload(request.workload)
    return StudySettings(
        name=study_name,
        workload=workload,
        space_path=resolve_space(request.space),
        pins=dict(request.pins),
        global_batch=request.global_batch,
        sampler=request.sampler,
        trials=request.trials,
        timeout_s=request.timeout_s,
        pareto=request.pareto,
        seed=request.seed,
        dispatch=MeasureOptions(
            launcher or request.launcher, ray_address, request.warmup, request.steps, request.run_timeout
        ),
    )


def default_lease_s() -> float:
    """The job lease: ``$DSTUNE_JOB_LEASE_S`` seconds, else 60 (:mod:`tuner.env`)."""
    return env.current().job_lease_s


class Heartbeat(threading.Thread):
    """Renews ``worker``'s lease on a job every ``lease_s / 4`` seconds until :meth:`stop`; sets :attr:`lost` once
    the job was taken over (or finished) by someone else. A renewal that fails because the database is out of reach
    is tried again at the next beat: the lease covers outages shorter than itself."""

    def __init__(self, store: Store, job_id: int, worker: str, lease_s: float) -> None:
        super().__init__(name=f"dstune-heartbeat-{job_id}", daemon=True)
        self.store, self.job_id, self.worker, self.lease_s = store, job_id, worker, lease_s
        self.lost = threading.Event()
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.lease_s / 4):
            try:
                held = self.store.renew_lease(self.job_id, self.worker, self.lease_s)
            except DatabaseUnavailable as error:
                _log.warning("job %s: lease not renewed: %s", self.job_id, error)
                continue
            if held is None:
                _log.warning("job %s: lease lost (taken over or finished elsewhere); stopping", self.job_id)
                self.lost.set()
                return

    def stop(self) -> None:
        """End the beats (the thread exits within one beat; it is a daemon either way)."""
        self._stopped.set()


class JobHandle:
    """What an executor may do to its job: report progress, and ask whether it must stop (cancelled, or its lease
    was lost to another worker)."""

    def __init__(self, store: Store, job_id: int, heartbeat: Heartbeat | None = None) -> None:
        self.store, self.job_id, self.heartbeat = store, job_id, heartbeat

    @property
    def lease_lost(self) -> bool:
        """True once another worker took the job over: this one must stop and record nothing more about the job."""
        return self.heartbeat is not None and self.heartbeat.lost.is_set()

    def report(self, progress: dict[str, Any]) -> bool:
        """Write the job's progress; True when the job must stop (cancellation requested, lease lost)."""
        return self.store.update_job_progress(self.job_id, progress).status == "cancel_requested" or self.lease_lost

    def cancel_requested(self) -> bool:
        """True once ``DELETE /v1/jobs/{id}`` (or :meth:`Store.cancel_job`) asked the running job to stop, or the
        lease was lost."""
        if self.lease_lost:
            return True
        job = self.store.get_job(self.job_id)
        return job is None or job.status == "cancel_requested"


Executor = Callable[[Store, JobRecord, JobHandle], str]
"""Runs one claimed job; returns ``"done"``, ``"cancelled"`` or ``"interrupted"`` (the worker itself was stopped);
an exception fails the job."""


def run_study_job(
    store: Store, job: JobRecord, handle: JobHandle, *, launcher: str | None = None, ray_address: str | None = None
) -> str:
    """The default executor: run the job as a study until its budget, or until it is cancelled."""
    from tuner.measure.dispatch import Dispatcher

    request = JobRequest.model_validate(job.request)
    settings = study_settings(request, job.study_name, launcher=launcher, ray_address=ray_address)
    tuning = TuningStudy(settings, store)
    state: dict[str, Any] = {"best_tokens_per_s": None}

    def on_event(event: Event) -> None:
        if event.status == "ok" and (event.tokens_per_s or 0) > (state["best_tokens_per_s"] or 0):
            state["best_tokens_per_s"] = event.tokens_per_s
        handle.report(
            {
                "study_id": tuning.study_id,
                "trials": tuning.configs_recorded(),
                "budget": settings.trials,
                "best_tokens_per_s": state["best_tokens_per_s"],
                "last": {"number": event.number, "status": event.status, "reason": event.reason},
            }
        )

    tuning.on_event = on_event
    handle.report({"study_id": tuning.study_id, "trials": tuning.configs_recorded(), "budget": settings.trials})
    dispatcher = Dispatcher(settings.dispatch, settings.workload.cluster.device, settings.workload.cluster.world_size)
    try:
        report = tuning.run(dispatcher, should_stop=handle.cancel_requested)
    finally:
        dispatcher.close(wait=False)
    best = store.best_trial(tuning.study_id)
    handle.report(
        {
            "study_id": tuning.study_id,
            "trials": sum(report.counts.values()),
            "budget": settings.trials,
            "counts": report.counts,
            "best_tokens_per_s": None if best is None else best.tokens_per_s,
            "best_trial_id": None if best is None else best.id,
        }
    )
    if report.stopped:
        return "cancelled"
    return "interrupted" if report.interrupted else "done"


def run_claimed(store: Store, job: JobRecord, executor: Executor, lease_s: float | None = None) -> str:
    """Run a job this worker holds (status running) and record how it ended; returns that status, or ``"lost"``
    (another worker took the job over; nothing recorded) or ``"unavailable"`` (the database went away; the job is
    left to its lease). A job claimed with a lease has it renewed by a :class:`Heartbeat` (every ``lease_s / 4``)."""
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


RAY_JOB_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
"""Ray job statuses after which nothing more runs on the cluster for that submission."""

LOG_TAIL_LINES, LOG_TAIL_CHARS = 20, 2000


def submit_to_ray(
    store: Store,
    job: JobRecord,
    address: str,
    storage_url: str,
    launcher: str | None = None,
    client: JobSubmissionClient | None = None,
) -> str:
    """Submit a claimed job to a Ray cluster through the Ray Jobs API (``address``: the dashboard, e.g.
    ``http://HEAD:8265``); the cluster runs ``dstune worker --job ID`` (with ``--launcher`` when given: else the
    job's own launcher). The database URL travels as the ``DSTUNE_STORAGE`` environment variable of the Ray job (not
    on its command line). Returns the submission id."""
    if client is None:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(address)
    # ``--ray-address auto``: the trials go to the cluster running the job (its RAY_ADDRESS); with no address the
    # entrypoint would try to start a private local Ray, which Ray refuses inside a job.
    override = f" --launcher {shlex.quote(launcher)}" if launcher else ""
    submission_id = client.submit_job(
        entrypoint=f"dstune worker --job {job.id}{override} --ray-address auto",
        submission_id=f"dstune-job-{job.id}-{secrets.token_hex(4)}",  # unique across databases sharing the cluster
        runtime_env={"env_vars": {STORAGE_ENV: storage_url}},
        metadata={"dstune_job": str(job.id), "study": job.study_name},
    )
    store.update_job_progress(job.id, {"ray_submission_id": submission_id, "ray_address": address})
    return submission_id


def follow_submission(store: Store, client: JobSubmissionClient, job_id: int, submission_id: str) -> bool:
    """Look once at a job this worker submitted; True once there is nothing more to follow (its Ray job ended, or
    the job was cancelled before its Ray job started).

    A Ray job that ended while its dstune job is still running (the entrypoint crashed, ``dstune`` is missing on the
    cluster, someone stopped the Ray job) fails the dstune job with the Ray status and the tail of the Ray job's logs.
    A job cancelled while its Ray job is still pending ends ``cancelled`` at once, and the Ray job is asked to stop
    (one that started stops itself between trials). The job's progress then keeps the submission id and Ray status.
    """
    info = client.get_job_info(submission_id)
    status = str(info.status)
    job = store.get_job(job_id)
    if job is None:
        return True
    if status == "PENDING" and job.status == "cancel_requested":
        # Ray acts on the stop once the job's supervisor starts (a job waiting for resources can stay PENDING for
        # RAY_JOB_START_TIMEOUT_SECONDS), so it is not waited for; an entrypoint that starts finds its job cancelled.
        client.stop_job(submission_id)
        store.finish_job(job_id, "cancelled", f"cancelled on request before Ray job {submission_id} started")
    elif status not in RAY_JOB_ENDED:
        return False
    elif job.status in ("running", "cancel_requested"):
        reason = (info.message or "").split(", last available logs")[0].strip()
        store.finish_job(
            job_id,
            "failed",
            f"Ray job {submission_id} ended {status} ({reason}) while the dstune job was {job.status}; "
            f"last lines of its logs:\n{_log_tail(client, submission_id)}",
        )
    store.update_job_progress(job_id, {"ray_submission_id": submission_id, "ray_status": status})
    return True


def _log_tail(client: JobSubmissionClient, submission_id: str) -> str:
    """The last :data:`LOG_TAIL_LINES` lines of a Ray job's logs, at most :data:`LOG_TAIL_CHARS` characters."""
    try:
        logs = client.get_job_logs(submission_id)
    except Exception as error:  # the failure is still worth recording without its logs
        return f"(logs unavailable: {type(error).__name__}: {error})"
    return "\n".join(logs.rstrip().splitlines()[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]


def submit_loop(
    store: Store,
    address: str,
    storage_url: str,
    *,
    once: bool,
    poll: float,
    name: str | None = None,
    timeout: float | None = None,
    stop: threading.Event | None = None,
    launcher: str | None = None,
) -> list[int]:
    """Claim queued jobs, submit each to the Ray cluster and follow it there (:func:`follow_submission`) until
    ``stop`` is set; with ``once``, until the queue is empty and every followed job has ended, or ``timeout``
    seconds have passed (:class:`TimeoutError`). A failed submission fails the job. Jobs submitted earlier to the same
    cluster and still running (a submitter that was restarted) are followed too. Returns the submitted job ids."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    name = name or default_worker_name()
    stop = stop or threading.Event()
    deadline = None if timeout is None else time.monotonic() + timeout
    submitted: list[int] = []
    following = running_submissions(store, address)  # job id -> Ray submission id
    while not stop.is_set():
        job = store.claim_next_job(name, lease_s=default_lease_s())
        if job is not None:
            try:
                following[job.id] = submit_to_ray(store, job, address, storage_url, launcher, client=client)
                submitted.append(job.id)
            except Exception as error:
                store.finish_job(job.id, "failed", f"Ray submission failed: {type(error).__name__}: {error}")
            continue  # claim the rest of the queue before looking at the cluster
        for job_id, submission_id in list(following.items()):
            # hold the lease until the cluster's worker takes it over (run_job): the Ray job may wait for resources
            store.renew_lease(job_id, name, default_lease_s())
            try:
                ended = follow_submission(store, client, job_id, submission_id)
            except (OSError, RuntimeError):  # the job server did not answer (Ray's errors): look again next poll
                continue
            if ended:
                del following[job_id]
        if once and not following:
            break
        if once and deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"submitted jobs still running on the Ray cluster: {sorted(following)}")
        stop.wait(poll)
    return submitted


def running_submissions(store: Store, address: str) -> dict[int, str]:
    """Jobs the database says are running on the Ray cluster at ``address``: job id -> Ray submission id."""
    found = {}
    for status in ("running", "cancel_requested"):
        for job in store.list_jobs(status=status, limit=10_000):
            progress = job.progress or {}
            if progress.get("ray_address") == address and progress.get("ray_submission_id"):
                found[job.id] = str(progress["ray_submission_id"])
    return found


def default_worker_name() -> str:
    """``host:pid:thread`` (what the job row's ``worker`` column shows)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


__all__ = [
    "LEASE_ENV",
    "STORAGE_ENV",
    "Executor",
    "Heartbeat",
    "JobHandle",
    "default_lease_s",
    "follow_submission",
    "run_claimed",
    "run_job",
    "run_study_job",
    "running_submissions",
    "study_settings",
    "submit_loop",
    "submit_to_ray",
    "work",
]
