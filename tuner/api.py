"""dstune's HTTP API (FastAPI), served by ``dstune serve`` on the tuner's database. The OpenAPI schema is the contract.

Endpoints:
    * ``GET /healthz``: the server and its database answer.
    * ``POST /v1/estimate``: a workload and a ds_config (or the CLI's shortcut fields) → the estimate by category.
    * ``POST /v1/recommend``: a workload → the best config, ``source`` measured | nearest | estimate
      (:mod:`tuner.recommend`).
    * ``GET /v1/studies``, ``GET /v1/studies/{name}``, ``GET /v1/studies/{name}/trials`` (paged).
    * ``POST /v1/jobs`` (queue a tuning job), ``GET /v1/jobs``, ``GET /v1/jobs/{id}``, ``DELETE /v1/jobs/{id}``
      (cancel).

Auth: the mutating endpoints (``POST /v1/jobs``, ``DELETE /v1/jobs/{id}``) need ``Authorization: Bearer <token>``;
a missing token answers 401, a wrong one 403. A server started without a token answers them 503 unless it was made
open on purpose (``insecure_no_auth``). Estimate and recommend are read-only computations on request data and stay
open, like the GET endpoints. Bad input answers 422 with the field's path (FastAPI's ``{"detail": [{"loc", "msg",
"type"}]}``), unknown studies and jobs 404, bodies over ``max_body_bytes`` 413. Requests carry model specs only
(preset names, inline config objects, parameter counts), never paths: the API reads no user files and runs no code.
"""

from __future__ import annotations

import contextlib
import gc
import secrets
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from tuner.answer_cache import AnswerCache
from tuner.dsconfig import merge_configs, shortcut_config
from tuner.jobs import (
    FieldError,
    JobRequest,
    ProfilePending,
    WorkloadRequest,
    check_job,
    checked_estimate,
    to_workload,
)
from tuner.recommend import NoFeasibleConfig, normalised, recommend
from tuner.store import JOB_STATES, TRIAL_ORDERS, TRIAL_STATUSES, JobRecord, Store, StudyRecord, TrialRecord

TrialOrder = Literal[tuple(TRIAL_ORDERS) + tuple(f"-{name}" for name in TRIAL_ORDERS)]  # type: ignore[valid-type]
TrialStatus = Literal[TRIAL_STATUSES]  # type: ignore[valid-type]
JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]
StudyName = Annotated[str, Path(min_length=1, max_length=255)]


# ------------------------------------------------------------------------------------------------------------- models


class EstimateRequest(BaseModel):
    """A workload and the ds_config to estimate: the shortcut fields, with ``ds_config`` merged over them (it wins),
    as ``dstune estimate`` does with ``--ds-config``."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadRequest
    stage: int = Field(0, ge=0, le=3)
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    ds_config: dict[str, Any] | None = None


class PhaseBytes(BaseModel):
    gpu: int
    cpu: int


class EstimateResponse(BaseModel):
    """The ``dstune estimate --json`` object: sizes in bytes, per GPU by category (``activations`` null for a bare
    parameter count), per node's CPU, the fit and the phase of the peak."""

    n_params: int
    architecture: str = Field("", description="transformers' class (MixtralForCausalLM), or the model family.")
    activations_source: str = Field("none", description="trace (the model's traced profile), formula, or none.")
    world_size: int
    per_gpu: dict[str, int | None]
    cpu_per_node: dict[str, int]
    nvme_per_node: int
    gpu_memory: int
    cpu_memory: int
    fits: bool
    headroom: int
    cpu_headroom: int
    peak_phase: str
    phases: dict[str, PhaseBytes]
    details: dict[str, int]
    reason: str | None
    ds_config: dict[str, Any] = Field(description="The config that was estimated (shortcut fields + ds_config).")


class RecommendRequest(BaseModel):
    """The workload to recommend for; its micro_batch, grad_accum and activation_checkpointing are ignored (they are
    what is recommended)."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadRequest


class RecommendResponse(BaseModel):
    source: Literal["measured", "nearest", "estimate"] = Field(
        description="measured: this workload's best measured trial; nearest: the best measured trial of the same "
        "model on another workload that the estimator says fits this one; estimate: the estimator's pick."
    )
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    tokens_per_s: float | None = Field(description="Measured throughput (on measured_on's workload); null: estimate.")
    peak_bytes: int | None = Field(description="Measured peak per GPU; null for estimate.")
    estimated_peak_bytes: int | None
    trial_id: int | None
    study: str | None
    workload_fingerprint: str
    measured_on: str | None = Field(description="Fingerprint of the workload the trial was measured on.")
    margin: float = Field(description="The calibrated safety margin used for the fit check.")


class StudyOut(BaseModel):
    id: int
    name: str
    sampler: str
    status: str
    objectives: list[Any]
    settings: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class TrialOut(BaseModel):
    id: int
    study_id: int
    number: int
    config_key: str
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    params: dict[str, Any] | None
    estimated_peak_bytes: int | None
    status: str
    prune_reason: str | None
    tokens_per_s: float | None
    peak_bytes: int | None
    error: str | None
    attempts: int
    hardware: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None


class StudyDetail(BaseModel):
    study: StudyOut
    workload: dict[str, Any]
    total: int
    counts: dict[str, int]
    pruned_reasons: dict[str, int]
    best: TrialOut | None


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int = Field(description="Trials matching the filter, over all pages.")
    limit: int
    offset: int


class JobOut(BaseModel):
    id: int
    study_name: str
    status: Literal[JOB_STATES]  # type: ignore[valid-type]
    request: dict[str, Any]
    worker: str | None
    progress: dict[str, Any] | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class Health(BaseModel):
    status: Literal["ok"]
    database: str


def _study_out(record: StudyRecord) -> StudyOut:
    return StudyOut.model_validate(record, from_attributes=True)


def _trial_out(record: TrialRecord) -> TrialOut:
    return TrialOut.model_validate(record, from_attributes=True)


def _job_out(record: JobRecord) -> JobOut:
    return JobOut.model_validate(record, from_attributes=True)


def _invalid(error: FieldError) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", *error.loc), "msg": error.message, "type": "value_error"}])


# -------------------------------------------------------------------------------------------------------------- app

bearer = HTTPBearer(auto_error=False, description="The server's API token (dstune serve --token-file/env).")


def store_of(request: Request) -> Store:
    return request.app.state.store


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    expected = request.app.state.token
    if expected is None:
        if request.app.state.insecure_no_auth:
            return
        raise HTTPException(503, "mutating endpoints are disabled: the server has no API token")
    if credentials is None:
        raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(403, "invalid token")


StoreDep = Annotated[Store, Depends(store_of)]
Auth = Depends(require_token)
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the app, SQLAlchemy's and Optuna's internals: about 100,000)
    out of the garbage collector's reach. A full collection over them takes about 85 ms on this machine and would
    stall every request in flight whenever it runs; after the freeze it scans only what requests allocate."""
    gc.collect()
    gc.freeze()


def create_app(
    store_url: str,
    token: str | None,
    insecure_no_auth: bool = False,
    max_body_bytes: int = 1_000_000,
    recommend_cache_s: float = 2.0,
    freeze_gc: bool = False,
) -> FastAPI:
    """The API over the database at ``store_url`` (migrated on open). ``token`` guards the mutating endpoints; with
    none they answer 503 unless ``insecure_no_auth``. ``app.state.store`` is the :class:`Store`. A workload's
    recommendation is answered from memory for ``recommend_cache_s`` seconds, then refreshed in the background
    (:mod:`tuner.answer_cache`; 0: computed for every request). ``freeze_gc``: :func:`freeze_startup_objects` at
    start-up (for a server process; ``dstune serve`` sets it)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if freeze_gc:
            freeze_startup_objects()
        yield
        app.state.store.close()

    app = FastAPI(
        lifespan=lifespan,
        title="dstune",
        summary="DeepSpeed config tuning: estimates, recommendations, studies and tuning jobs.",
        version="1",
        max_body_size=max_body_bytes,  # larger bodies answer 413, by Content-Length or counted while read
    )
    app.state.store = Store.open(store_url)
    app.state.token = token
    app.state.insecure_no_auth = insecure_no_auth
    app.state.recommend_cache = AnswerCache(
        recommend_cache_s, max_stale_s=max(60.0, recommend_cache_s), cache_errors=(NoFeasibleConfig, FieldError)
    )

    @app.exception_handler(ProfilePending)
    async def profile_pending(request: Request, error: ProfilePending) -> Response:
        """A new model's profile is still being computed off the request path: 503, retry later."""
        from fastapi.responses import JSONResponse

        return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": str(error.retry_after)})

    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz(store: StoreDep) -> Health:
        """Liveness and database reachability."""
        store.list_jobs(limit=1)
        return Health(status="ok", database=store.engine.dialect.name)

    @app.post("/v1/estimate", response_model=EstimateResponse, tags=["estimate"])
    def estimate_endpoint(body: EstimateRequest) -> EstimateResponse:
        """Estimate peak memory per GPU and per node's CPU, by category, for one workload and ds_config."""
        try:
            workload = to_workload(body.workload, ("workload",))
            train = workload.train
            config = shortcut_config(
                train.micro_batch,
                train.grad_accum,
                train.precision,
                body.stage,
                body.offload_optimizer,
                body.offload_param,
            )
            if body.ds_config is not None:
                config = merge_configs(config, body.ds_config)
            est = checked_estimate(workload, config)
        except FieldError as error:
            raise _invalid(error) from None
        return EstimateResponse(**est.to_dict(), ds_config=config)

    @app.post(
        "/v1/recommend",
        response_model=RecommendResponse,
        tags=["recommend"],
        responses={422: {"description": "Bad workload, or no config of the default space fits it."}},
    )
    async def recommend_endpoint(body: RecommendRequest, request: Request) -> Response:
        """The best config for a workload: measured, else the nearest measured one re-checked, else estimated."""
        store = store_of(request)  # not a sync dependency: that would cost a worker-thread hop per request

        def answer() -> bytes:  # blocking (database, estimator): runs in a worker thread
            workload = normalised(to_workload(body.workload, ("workload",)))
            return RecommendResponse(**recommend(store, workload).__dict__).model_dump_json().encode()

        try:  # keyed by the request's workload as sent; a bad workload is an answer too (the same 422 each time)
            content = await request.app.state.recommend_cache.get(body.workload.model_dump_json(), answer)
        except FieldError as error:
            raise _invalid(error) from None
        except NoFeasibleConfig as error:
            raise _invalid(FieldError(("workload",), str(error))) from None
        return Response(content, media_type="application/json")

    def _study(store: Store, name: str) -> StudyRecord:
        record = store.get_study(name)
        if record is None:
            raise HTTPException(404, f"no study named {name!r}")
        return record

    @app.get("/v1/studies", response_model=list[StudyOut], tags=["studies"])
    def list_studies(store: StoreDep) -> list[StudyOut]:
        """Every study, newest first."""
        return [_study_out(record) for record in store.list_studies()]

    @app.get("/v1/studies/{name}", response_model=StudyDetail, tags=["studies"], responses={404: {}})
    def get_study(name: StudyName, store: StoreDep) -> StudyDetail:
        """A study: its workload, trial counts by status, pruned reasons and best trial."""
        record = _study(store, name)
        summary = store.study_summary(record.id)
        from tuner.workload import workload_to_dict

        return StudyDetail(
            study=_study_out(record),
            workload=workload_to_dict(store.workload_of(record.id)),
            total=summary.total,
            counts=summary.counts,
            pruned_reasons=summary.pruned_reasons,
            best=None if summary.best is None else _trial_out(summary.best),
        )

    @app.get("/v1/studies/{name}/trials", response_model=TrialPage, tags=["studies"], responses={404: {}})
    def study_trials(
        name: StudyName,
        store: StoreDep,
        status: TrialStatus | None = None,
        order_by: TrialOrder = "number",
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    ) -> TrialPage:
        """A page of a study's trials, optionally of one status, sorted by ``order_by`` (``-`` for descending)."""
        record = _study(store, name)
        summary = store.study_summary(record.id)
        total = summary.total if status is None else summary.counts.get(status, 0)
        items = store.trials(record.id, status=status, order_by=order_by, limit=limit, offset=offset)
        return TrialPage(items=[_trial_out(t) for t in items], total=total, limit=limit, offset=offset)

    @app.post("/v1/jobs", response_model=JobOut, status_code=201, tags=["jobs"], dependencies=[Auth])
    def create_job(body: JobRequest, store: StoreDep) -> JobOut:
        """Queue a tuning job; a ``dstune worker`` runs it as a study."""
        try:
            study_name = check_job(body)
        except FieldError as error:
            raise _invalid(error) from None
        return _job_out(store.enqueue_job(study_name, body.model_dump(mode="json")))

    @app.get("/v1/jobs", response_model=list[JobOut], tags=["jobs"])
    def list_jobs(
        store: StoreDep,
        status: JobStatus | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    ) -> list[JobOut]:
        """Jobs, newest first."""
        return [_job_out(job) for job in store.list_jobs(status=status, limit=limit, offset=offset)]

    @app.get("/v1/jobs/{job_id}", response_model=JobOut, tags=["jobs"], responses={404: {}})
    def get_job(job_id: JobId, store: StoreDep) -> JobOut:
        """A job's status and progress (trials done, best so far)."""
        job = store.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return _job_out(job)

    @app.delete("/v1/jobs/{job_id}", response_model=JobOut, tags=["jobs"], dependencies=[Auth], responses={404: {}})
    def cancel_job(job_id: JobId, store: StoreDep) -> JobOut:
        """Cancel a job: a queued one at once; a running one is stopped by its worker between trials
        (``cancel_requested`` until then). A finished job is returned unchanged."""
        if store.get_job(job_id) is None:
            raise HTTPException(404, f"no job {job_id}")
        return _job_out(store.cancel_job(job_id))

    try:  # the dashboard's pages, when that package is installed alongside
        from tuner.dashboard import router as dashboard_router
    except ImportError:
        dashboard_router = None
    if dashboard_router is not None:
        app.include_router(dashboard_router)

    return app


def create_app_from_env() -> FastAPI:
    """:func:`create_app` configured by the environment ``dstune serve --workers N`` sets for each worker process:
    ``DSTUNE_STORAGE``, ``DSTUNE_API_TOKEN``, ``DSTUNE_INSECURE_NO_AUTH`` (``1``) and ``DSTUNE_MAX_BODY_BYTES``."""
    import os

    from tuner.store import default_url

    return create_app(
        os.environ.get("DSTUNE_STORAGE") or default_url(),
        os.environ.get("DSTUNE_API_TOKEN") or None,
        insecure_no_auth=os.environ.get("DSTUNE_INSECURE_NO_AUTH") == "1",
        max_body_bytes=int(os.environ.get("DSTUNE_MAX_BODY_BYTES", "1000000")),
        recommend_cache_s=float(os.environ.get("DSTUNE_RECOMMEND_CACHE_S", "2.0")),
        freeze_gc=True,
    )


__all__ = [
    "EstimateRequest",
    "EstimateResponse",
    "RecommendRequest",
    "RecommendResponse",
    "create_app",
    "create_app_from_env",
]
