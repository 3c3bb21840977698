"""``POST /v1/jobs`` (queue a tuning job), ``GET /v1/jobs``, ``GET /v1/jobs/{id}`` and ``DELETE /v1/jobs/{id}``
(cancel). Queueing and cancelling need the bearer token (:func:`tuner.api.deps.require_token`). A job that carries a
training command (``script``) is refused (403) with any token: a request never makes a worker run code; such a job
is queued with ``dstune queue JOB.json -- <command>`` by someone holding the database's URL
(:mod:`tuner.requests.script_job`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException

from tuner.api.deps import Auth, JobId, Limit, Offset, StoreDep, invalid
from tuner.api.readers import OPTIONAL_TOKEN, FullView, shown_job
from tuner.api.responses import AUTH, BODY, NOT_FOUND, READER, answers
from tuner.api.schemas import JobOut
from tuner.requests import FieldError, JobRequest, check_job
from tuner.storage import JOB_STATES

JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]

router = APIRouter(tags=["jobs"])
SCRIPT_REFUSED = (
    "script: the API queues no job that runs a command; queue it with `dstune queue JOB.json -- <command>` where "
    "the database's URL is, for a worker started with --allow-scripts"
)


@router.post("/v1/jobs", response_model=JobOut, status_code=201, dependencies=[Auth], responses=answers(BODY, AUTH))
def create_job(body: JobRequest, store: StoreDep) -> JobOut:
    """Queue a tuning job; a ``dstune worker`` runs it as a study. A job with a training command (``script``) is
    refused (403): queue it with ``dstune queue JOB.json -- <command>``."""
    if body.script is not None:
        raise HTTPException(403, SCRIPT_REFUSED)
    try:
        study_name = check_job(body, inline=False)
    except FieldError as error:
        raise invalid(error) from None
    return JobOut.of(store.enqueue_job(study_name, body.model_dump(mode="json")))


@router.get("/v1/jobs", response_model=list[JobOut], responses=answers(READER), openapi_extra=OPTIONAL_TOKEN)
def list_jobs(
    store: StoreDep, full: FullView, status: JobStatus | None = None, limit: Limit = 100, offset: Offset = 0
) -> list[JobOut]:
    """Jobs, newest first (without the token: no launch variables, errors as one line without paths)."""
    return [shown_job(JobOut.of(job), full) for job in store.list_jobs(status=status, limit=limit, offset=offset)]


@router.get(
    "/v1/jobs/{job_id}", response_model=JobOut, responses=answers(READER, NOT_FOUND), openapi_extra=OPTIONAL_TOKEN
)
def get_job(job_id: JobId, store: StoreDep, full: FullView) -> JobOut:
    """A job's status and progress (trials done, best so far); without the token, as :func:`list_jobs` shows it."""
    job = store.get_job(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return shown_job(JobOut.of(job), full)


@router.delete("/v1/jobs/{job_id}", response_model=JobOut, dependencies=[Auth], responses=answers(AUTH, NOT_FOUND))
def cancel_job(job_id: JobId, store: StoreDep) -> JobOut:
    """Cancel a job: a queued one at once; a running one is stopped by its worker between trials
    (``cancel_requested`` until then). A finished job is returned unchanged."""
    if store.get_job(job_id) is None:
        raise HTTPException(404, f"no job {job_id}")
    return JobOut.of(store.cancel_job(job_id))
