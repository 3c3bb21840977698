"""Status names: declared once as StrEnums; the tuples callers use, and the values stored, stay plain strings."""

from __future__ import annotations

import sqlalchemy as sa

import tuner.storage as storage
from tuner.storage import (
    FINISHED_STATUSES,
    JOB_STATES,
    JOB_STATUSES,
    RETRYABLE_STATUSES,
    STUDY_STATUSES,
    TRIAL_STATUSES,
    JobStatus,
    Store,
    StudyStatus,
    TrialStatus,
)
from tuner.workload import Workload, model_from_param_count


def test_status_tuples_keep_their_values_and_order() -> None:
    """The API builds ``Literal`` types (so its OpenAPI enums) from these tuples: values and order are a contract."""
    finished = ("pruned", "ok", "oom", "error", "timeout", "invalid_config", "failed", "diverged")
    assert finished == FINISHED_STATUSES
    assert ("pending", "running", *finished) == TRIAL_STATUSES
    assert RETRYABLE_STATUSES == ("pending", "failed", "error", "timeout")
    assert STUDY_STATUSES == ("created", "running", "finished", "interrupted", "failed")
    assert JOB_STATUSES == ("queued", "running", "done", "failed", "cancelled")
    assert JOB_STATES == ("queued", "running", "done", "failed", "cancelled", "cancel_requested")
    for names in (TRIAL_STATUSES, FINISHED_STATUSES, RETRYABLE_STATUSES, STUDY_STATUSES, JOB_STATES):
        assert all(type(name) is str for name in names)


def test_enums_equal_their_strings() -> None:
    assert [*TrialStatus] == list(TRIAL_STATUSES) and [*StudyStatus] == list(STUDY_STATUSES)
    assert [*JobStatus] == list(JOB_STATES)
    assert TrialStatus.INVALID_CONFIG == "invalid_config" and f"{JobStatus.CANCEL_REQUESTED}" == "cancel_requested"
    assert {TrialStatus.OK: 1} == {"ok": 1} and hash(TrialStatus.OK) == hash("ok")


def test_enum_members_in_store_plain_strings_out(store: Store) -> None:
    workload_id = store.upsert_workload(Workload(model_from_param_count(1e9)))
    study = store.get_or_create_study("s", workload_id, "tpe", {})
    assert type(store.set_study_status(study.id, StudyStatus.RUNNING).status) is str
    trial_id = store.add_trial(study.id, 0, "k", {}, None, False, None, status=TrialStatus.PENDING)
    store.start_trial(trial_id)
    done = store.finish_trial(trial_id, TrialStatus.OK, {"tokens_per_s": 1.0})
    assert (done.status, type(done.status)) == ("ok", str)
    assert [t.id for t in store.trials(study.id, status=TrialStatus.OK)] == [trial_id]
    job = store.enqueue_job("s", {})
    assert type(job.status) is str and job.status == JobStatus.QUEUED
    store.claim_job(job.id, "w")
    assert store.cancel_job(job.id).status == "cancel_requested"
    assert type(store.finish_job(job.id, JobStatus.CANCELLED).status) is str
    with store.engine.connect() as connection:  # what the database holds is the plain value
        stored = connection.execute(sa.text("SELECT status FROM dstune_trials")).scalar_one()
        job_status = connection.execute(sa.text("SELECT status FROM dstune_jobs")).scalar_one()
        study_status = connection.execute(sa.text("SELECT status FROM dstune_studies")).scalar_one()
    assert (stored, job_status, study_status) == ("ok", "cancelled", "running")


def test_package_exports_what_callers_import() -> None:
    for name in ("StudyRow", "TrialRow", "WorkloadRow", "utcnow", "RETRYABLE_STATUSES", "TrialRecord", "JobRecord"):
        assert name in storage.__all__ and hasattr(storage, name)
    assert all(hasattr(storage, name) for name in storage.__all__)
