"""``dstune worker``: the job-queue consumer, a face over :mod:`tuner.study` and :mod:`tuner.storage`.

``claims`` claims queued jobs and runs each (``study_job``: as a study), under a heartbeated lease (``lease``);
``ray_jobs`` submits them to a Ray cluster's Jobs API instead. Nothing below imports this room.
"""

from tuner.worker.claims import Executor, run_claimed, run_job, work
from tuner.worker.lease import LEASE_ENV, Heartbeat, JobHandle, default_lease_s
from tuner.worker.ray_jobs import STORAGE_ENV, follow_submission, running_submissions, submit_loop, submit_to_ray
from tuner.worker.study_job import run_study_job, study_settings

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
