"""The job queue (``dstune_jobs``): the API server enqueues tuning requests, workers claim, report and finish them.

:class:`JobQueue` is a part of :class:`tuner.storage.Store` (``store.enqueue_job(...)``, ``store.claim_next_job(...)``).
A job goes queued → running → done | failed | cancelled; cancelling a running job asks its worker to stop
(``cancel_requested``). No job is ever claimed twice, by threads or processes, on SQLite or PostgreSQL.

Leases: a claim holds the job for ``lease_s`` seconds; the worker's heartbeat (:meth:`JobQueue.renew_lease`) extends
it while the job runs. A worker that dies stops renewing; once its lease has passed, the next claim takes the job over
(the study resumes where the dead worker left it), or, after :data:`MAX_ATTEMPTS` claims, fails it with the reason. A
cancelled job whose worker died ends cancelled. Lease times come from the workers' clocks: keep them synchronised
(NTP) to well within a lease.

Example:
    >>> import tempfile
    >>> queue = JobQueue.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db")
    >>> job = queue.enqueue_job("demo", {"model": "gpt2"})
    >>> queue.claim_next_job("worker-1").status, queue.claim_next_job("worker-2")
    ('running', None)
    >>> queue.renew_lease(job.id, "worker-2") is None  # only the holder renews
    True
    >>> queue.finish_job(job.id, "done", worker="worker-1").status
    'done'
    >>> queue.close()
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa

from tuner.storage.engine import Database
from tuner.storage.errors import StoreError
from tuner.storage.records import JobRecord, existing, to_record
from tuner.storage.tables import JOB_FINISHED_STATUSES, JobRow, JobStatus, utcnow

DEFAULT_LEASE_S = 60.0
MAX_ATTEMPTS = 3  # claims of one job: a job whose workers died this often is failed rather than run again
HELD = (JobStatus.RUNNING, JobStatus.CANCEL_REQUESTED)
_CANDIDATES = 16  # rows looked at per claim (expired leases that only need finishing are finished and passed over)


def _expiry(now: datetime, lease_s: float | None) -> datetime | None:
    return None if lease_s is None else now + timedelta(seconds=lease_s)


class JobQueue(Database):
    """Queued tuning jobs: enqueue, claim (exactly once), progress, cancel, finish."""

    def enqueue_job(self, study_name: str, request: dict[str, Any]) -> JobRecord:
        """Queue a tuning job (``request`` is the JSON the worker rebuilds the study from); returns it, queued."""
        if not study_name:
            raise StoreError("study_name", "a job needs a study name")
        with self.session() as session:
            row = JobRow(study_name=study_name, request=dict(request), status=JobStatus.QUEUED, created_at=utcnow())
            session.add(row)
            session.flush()
            return to_record(JobRecord, row)

    def claim_next_job(self, worker: str, lease_s: float | None = DEFAULT_LEASE_S) -> JobRecord | None:
        """Take the oldest job for ``worker`` (now running, leased for ``lease_s`` seconds; None: no expiry), or None.

        A job is claimable when queued, or held by a worker whose lease has passed (taken over: ``attempts`` + 1, the
        dead worker named in ``progress["lease_expired"]``). An expired job that was being cancelled ends cancelled; one
        claimed :data:`MAX_ATTEMPTS` times already ends failed with the reason. No job is ever held by two workers:
        PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent claimers skip each other's rows and never wait).
        SQLite ignores ``FOR UPDATE``; its writing transactions start with ``BEGIN IMMEDIATE`` (the database's write
        lock), so select-then-update is serialised between processes and threads alike. Either way the update also
        requires the status and lease that were read and checks the row count, so a lost race can never double-claim.
        """
        return self._claim(worker, None, lease_s)

    def claim_job(self, job_id: int, worker: str, lease_s: float | None = DEFAULT_LEASE_S) -> JobRecord | None:
        """Take this very job for ``worker`` if it is claimable (as :meth:`claim_next_job`), else None."""
        return self._claim(worker, job_id, lease_s)

    def _claim(self, worker: str, job_id: int | None, lease_s: float | None) -> JobRecord | None:
        with self.session() as session:
            now = utcnow()
            expired = sa.and_(JobRow.status.in_(HELD), JobRow.lease_expires_at < now)
            query = sa.select(JobRow).where(sa.or_(JobRow.status == JobStatus.QUEUED, expired))
            if job_id is not None:
                query = query.where(JobRow.id == job_id)
            # one row locked at a time: locking a batch to claim one of them hid the rest of the batch from every
            # other claimer (SKIP LOCKED), which then found nothing although jobs were queued
            for _ in range(_CANDIDATES):
                row = session.scalars(query.order_by(JobRow.id).limit(1).with_for_update(skip_locked=True)).first()
                if row is None:
                    return None
                outcome = self._claim_row(session, row, worker, now, lease_s)
                if outcome is not None:
                    return outcome
            return None

    def _claim_row(
        self, session: Any, row: JobRow, worker: str, now: datetime, lease_s: float | None
    ) -> JobRecord | None:
        """Claim (or, for an expired lease that must not run again, finish) one candidate row read under lock."""
        status, held_by, expires = row.status, row.worker, row.lease_expires_at
        values: dict[str, Any] = {"worker": worker, "attempts": row.attempts + 1, "heartbeat_at": now}
        values["lease_expires_at"] = _expiry(now, lease_s)
        if status == JobStatus.QUEUED:
            values.update(status=JobStatus.RUNNING.value, started_at=now)
        else:
            gone = f"worker {held_by} stopped renewing its lease (expired {expires.isoformat() if expires else '?'})"
            if status == JobStatus.CANCEL_REQUESTED or row.attempts >= MAX_ATTEMPTS:
                why = "cancelled on request" if status == JobStatus.CANCEL_REQUESTED else "failed"
                values = {
                    "status": JobStatus.CANCELLED.value if why != "failed" else JobStatus.FAILED.value,
                    "error": f"{why}: {gone}" + ("" if why != "failed" else f"; claimed {row.attempts} times"),
                    "finished_at": now,
                    "lease_expires_at": None,
                }
            else:
                lapse = {"worker": held_by, "expired_at": expires.isoformat() if expires else None, "taken_by": worker}
                kept = {k: v for k, v in (row.progress or {}).items() if k not in ("ray_submission_id", "ray_address")}
                values["progress"] = {**kept, "lease_expired": lapse}  # a restarted submitter no longer follows it
        guard = [JobRow.id == row.id, JobRow.status == status, JobRow.attempts == row.attempts]
        result = session.execute(
            sa.update(JobRow).where(*guard).values(**values).execution_options(synchronize_session=False)
        )
        if cast(sa.CursorResult[Any], result).rowcount != 1 or values.get("status") in JOB_FINISHED_STATUSES:
            return None
        claimed = session.get(JobRow, row.id, populate_existing=True)
        assert claimed is not None
        return to_record(JobRecord, claimed)

    def renew_lease(
        self, job_id: int, worker: str, lease_s: float | None = DEFAULT_LEASE_S, *, new_worker: str | None = None
    ) -> JobRecord | None:
        """The heartbeat: extend ``worker``'s lease on a job it holds to ``lease_s`` seconds from now (None: no
        expiry). With ``new_worker`` the lease passes to that worker, if ``worker``'s has not expired yet (a job
        submitted to Ray is handed from the submitter to the worker running it on the cluster). Returns the job (its
        status says whether cancellation was requested), or None when ``worker`` no longer holds it (taken over,
        finished, or, with ``new_worker``, its lease expired)."""
        with self.session() as session:
            now = utcnow()
            held = [JobRow.id == job_id, JobRow.worker == worker, JobRow.status.in_(HELD)]
            if new_worker is not None:
                held.append(sa.or_(JobRow.lease_expires_at.is_(None), JobRow.lease_expires_at >= now))
            result = session.execute(
                sa.update(JobRow)
                .where(*held)
                .values(lease_expires_at=_expiry(now, lease_s), heartbeat_at=now, worker=new_worker or worker)
                .execution_options(synchronize_session=False)
            )
            if cast(sa.CursorResult[Any], result).rowcount != 1:
                return None
            row = session.get(JobRow, job_id, populate_existing=True)
            assert row is not None
            return to_record(JobRecord, row)

    def get_job(self, job_id: int) -> JobRecord | None:
        """A job by id, or None."""
        with self.session(write=False) as session:
            row = session.get(JobRow, job_id)
            return None if row is None else to_record(JobRecord, row)

    def list_jobs(self, status: str | None = None, limit: int = 100, offset: int = 0) -> list[JobRecord]:
        """Jobs, newest first, optionally of one status, paged."""
        query = sa.select(JobRow)
        if status is not None:
            query = query.where(JobRow.status == status)
        query = query.order_by(JobRow.id.desc()).offset(offset).limit(limit)
        with self.session(write=False) as session:
            return [to_record(JobRecord, row) for row in session.scalars(query)]

    def cancel_job(self, job_id: int) -> JobRecord:
        """Cancel a job: a queued one is cancelled at once; a running one becomes ``cancel_requested`` (its worker
        stops the study between trials and marks it cancelled); a finished one is returned unchanged."""
        with self.session() as session:
            row = existing(session, JobRow, job_id, "job", with_for_update=True)
            if row.status == JobStatus.QUEUED:
                row.status = JobStatus.CANCELLED
                row.finished_at = utcnow()
            elif row.status == JobStatus.RUNNING:
                row.status = JobStatus.CANCEL_REQUESTED
            session.flush()
            return to_record(JobRecord, row)

    def update_job_progress(self, job_id: int, progress: dict[str, Any]) -> JobRecord:
        """Merge ``progress`` into the job's progress JSON (its keys replace the same keys; others stay, such as the
        Ray submission id a submitting worker wrote); returns the job (its status tells the worker whether to stop)."""
        with self.session() as session:
            # locked: two writers (worker, submitter) lose nothing
            row = existing(session, JobRow, job_id, "job", with_for_update=True)
            row.progress = {**(row.progress or {}), **progress}
            session.flush()
            return to_record(JobRecord, row)

    def finish_job(self, job_id: int, status: str, error: str | None = None, worker: str | None = None) -> JobRecord:
        """End a job: ``done``, ``failed`` or ``cancelled`` (``finished_at`` now, lease released). With ``worker``,
        only while that worker still holds the job: a worker whose job was taken over gets a :class:`StoreError`
        (field ``worker``) and changes nothing."""
        if status not in JOB_FINISHED_STATUSES:
            raise StoreError("status", f"a job finishes done, failed or cancelled, got {status!r}")
        with self.session() as session:
            row = existing(session, JobRow, job_id, "job", with_for_update=True)
            if worker is not None and (row.worker != worker or row.status not in HELD):
                raise StoreError("worker", f"job {job_id} is {row.status} and held by {row.worker}, not {worker}")
            row.status = str(status)
            row.error = error
            row.finished_at = utcnow()
            row.lease_expires_at = None
            session.flush()
            return to_record(JobRecord, row)


__all__ = ["DEFAULT_LEASE_S", "MAX_ATTEMPTS", "JobQueue"]
