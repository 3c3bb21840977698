"""The job queue (``dstune_jobs``): the API server enqueues tuning requests, workers claim, report and finish them.

:class:`JobQueue` is a part of :class:`tuner.storage.Store` (``store.enqueue_job(...)``, ``store.claim_next_job(...)``).
A job goes queued → running → done | failed | cancelled; cancelling a running job asks its worker to stop
(``cancel_requested``). No job is ever claimed twice, by threads or processes, on SQLite or PostgreSQL.

Example:
    >>> import tempfile
    >>> queue = JobQueue.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db")
    >>> job = queue.enqueue_job("demo", {"model": "gpt2"})
    >>> queue.claim_next_job("worker-1").status, queue.claim_next_job("worker-2")
    ('running', None)
    >>> queue.finish_job(job.id, "done").status
    'done'
    >>> queue.close()
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa

from tuner.storage.engine import Database
from tuner.storage.errors import StoreError
from tuner.storage.records import JobRecord, existing, to_record
from tuner.storage.schema import JOB_FINISHED_STATUSES, JobRow, JobStatus, utcnow


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

    def claim_next_job(self, worker: str) -> JobRecord | None:
        """Take the oldest queued job for ``worker`` (now running), or None: no job is ever taken twice.

        PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent claimers skip each other's row and never wait).
        SQLite ignores ``FOR UPDATE``; its writing transactions start with ``BEGIN IMMEDIATE`` (the database's write
        lock), so select-then-update is serialised between processes and threads alike. Either way the update also
        requires ``status = 'queued'`` and checks the row count, so a lost race can never double-claim.
        """
        return self._claim(worker, None)

    def claim_job(self, job_id: int, worker: str) -> JobRecord | None:
        """Take this very job for ``worker`` if it is still queued (as :meth:`claim_next_job`), else None."""
        return self._claim(worker, job_id)

    def _claim(self, worker: str, job_id: int | None) -> JobRecord | None:
        with self.session() as session:
            queued = sa.select(JobRow.id).where(JobRow.status == JobStatus.QUEUED)
            if job_id is not None:
                queued = queued.where(JobRow.id == job_id)
            job_id = session.scalar(queued.order_by(JobRow.id).limit(1).with_for_update(skip_locked=True))
            if job_id is None:
                return None
            result = session.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED)
                .values(status=JobStatus.RUNNING.value, worker=worker, started_at=utcnow())
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

    def finish_job(self, job_id: int, status: str, error: str | None = None) -> JobRecord:
        """End a job: ``done``, ``failed`` or ``cancelled`` (``finished_at`` now)."""
        if status not in JOB_FINISHED_STATUSES:
            raise StoreError("status", f"a job finishes done, failed or cancelled, got {status!r}")
        with self.session() as session:
            row = existing(session, JobRow, job_id, "job")
            row.status = str(status)
            row.error = error
            row.finished_at = utcnow()
            session.flush()
            return to_record(JobRecord, row)


__all__ = ["JobQueue"]
