"""``dstune worker --submit --ray-address http://HEAD:8265``: the worker does not run jobs itself; it submits each
claimed job to the Ray cluster through the Ray Jobs API, as ``dstune worker --job ID`` running on the cluster, and
follows it there: a Ray job that ends while its dstune job is still running (the entrypoint crashed) fails the job with
the Ray status and the tail of the Ray job's logs.
"""

from __future__ import annotations

import secrets
import shlex
import threading
import time
from typing import TYPE_CHECKING

from tuner.storage import JobRecord, Store
from tuner.worker.lease import default_lease_s, default_worker_name

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

STORAGE_ENV = "DSTUNE_STORAGE"

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
