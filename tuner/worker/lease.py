"""Leases: a claimed job is leased to its worker, and a :class:`Heartbeat` thread renews the lease every quarter of it
while the job runs (``$DSTUNE_JOB_LEASE_S``, default 60 s). A worker that is killed stops renewing; once the lease has
passed, the next worker's claim takes the job over and its study resumes (trials the dead worker left running are
failed and retried once, finished ones are kept), so no job stays ``running`` forever. A worker that finds its lease
taken (it was stalled longer than the lease) stops its study and leaves the job to the new holder.

:class:`JobHandle` is what a job's executor sees of all this: report progress, and ask whether it must stop
(cancelled, or its lease lost).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from tuner import env
from tuner.storage import DatabaseUnavailable, Store

LEASE_ENV = "DSTUNE_JOB_LEASE_S"
_log = logging.getLogger(__name__)


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


def default_worker_name() -> str:
    """``host:pid:thread`` (what the job row's ``worker`` column shows)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
