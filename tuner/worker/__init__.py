"""``dstune worker``: the job-queue consumer, a face over :mod:`tuner.study` and :mod:`tuner.storage`.

``jobs`` claims queued jobs and runs each as a study (or submits it to a Ray cluster's Jobs API). Nothing below
imports this room.
"""

from tuner.worker.jobs import (
    LEASE_ENV,
    STORAGE_ENV,
    Executor,
    Heartbeat,
    JobHandle,
    default_lease_s,
    follow_submission,
    run_claimed,
    run_job,
    run_study_job,
    running_submissions,
    study_settings,
    submit_loop,
    submit_to_ray,
    work,
)

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
