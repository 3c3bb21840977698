"""dstune's HTTP API (FastAPI), served by ``dstune serve`` on the tuner's database. The OpenAPI schema is the contract.

Endpoints (one router per resource in :mod:`tuner.api.routes`; models in :mod:`tuner.api.schemas`):
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
"type"}]}``), unknown studies and jobs 404, bodies over ``max_body_bytes`` 413. An inline config whose profile is
not cached answers 503 with ``Retry-After`` while it is computed (:mod:`tuner.profile.service`), or at once when the
profiling queue is full, as does an answer past the request's time budget (its computation goes on, and the
retry is answered from memory), and a ``seq_len: "max"`` request that would start one long computation more than the
server (2) or its client (1) may run at once (:mod:`tuner.api.slots`). Requests carry model specs only (preset names,
inline config objects, parameter counts), never paths: the API reads no user files and runs no code, and launch
variables are an allow-list (:mod:`tuner.workload.launch_vars`). The GET endpoints show records without launch
variables, command lines or server paths to a reader without the token (:mod:`tuner.api.readers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from tuner.api.answer_cache import AnswerCache
from tuner.api.budget import OverBudget
from tuner.api.degraded import register as register_degraded
from tuner.api.invalid import register as register_invalid
from tuner.api.methods import register as register_methods
from tuner.api.routes import ROUTERS
from tuner.api.schemas import EstimateRequest, EstimateResponse, RecommendRequest, RecommendResponse
from tuner.api.slots import Busy, Slots
from tuner.api.too_large import JsonTooLarge
from tuner.api.unavailable import register as register_unavailable
from tuner.forecast import NoLengthFits
from tuner.profile.service import ProfilePending, ProfileQueueFull, default_service
from tuner.recommend import NoFeasibleConfig
from tuner.requests import FieldError
from tuner.storage import Store

# a seq_len "max" answer (seconds to minutes of work) is fresh this long after it is known, then served while one
# refresh runs (when a slot is free) until it is this old: measured runs change it only through the throughput fit
EXPENSIVE_TTL_S, EXPENSIVE_STALE_S = 300.0, 3600.0
WORKER_THREADS = 64  # the blocking parts of /v1/estimate and /v1/recommend (asyncio.to_thread)


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the app, SQLAlchemy's and Optuna's internals: about 100,000)
    out of the garbage collector's reach. A full collection over them takes about 85 ms on this machine and would
    stall every request in flight whenever it runs; after the freeze it scans only what requests allocate."""
    gc.collect()
    gc.freeze()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Freeze the start-up objects when asked (``app.state.freeze_gc``); while serving, cap how long a request's
    worker thread waits for a new model's profile at half the request budget (then 503; the profile goes on in the
    profiling service's process), so requests for new models cannot hold every worker thread; close the store at
    shutdown."""
    if app.state.freeze_gc:
        freeze_startup_objects()
    # worker threads mostly wait (database, a profile): more of them than asyncio's default (CPUs + 4), so a burst of
    # requests for new models waiting on their profiles does not queue every other computation behind them
    threads = ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="dstune-api")
    asyncio.get_running_loop().set_default_executor(threads)
    service, budget = default_service(), app.state.request_budget_s
    saved_wait = service.wait_s
    if budget > 0:
        service.wait_s = min(saved_wait, budget / 2)
    try:
        yield
    finally:
        service.wait_s = saved_wait
        service.close()  # its worker process ends with the server
        threads.shutdown(wait=False, cancel_futures=True)
        app.state.store.close()


async def _retry_later(request: Request, error: Exception) -> Response:
    """A new model's profile, or an answer past the request's budget, is still being computed off the request path,
    or the profiling queue is full: 503 with Retry-After (and what it is in ``detail``), not a wait."""
    retry_after = getattr(error, "retry_after", 5)
    return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": str(retry_after)})


def create_app(
    store_url: str,
    token: str | None,
    insecure_no_auth: bool = False,
    max_body_bytes: int = 1_000_000,
    recommend_cache_s: float = 2.0,
    freeze_gc: bool = False,
    request_budget_s: float = 10.0,
) -> FastAPI:
    """The API over the database at ``store_url`` (migrated on open). ``token`` guards the mutating endpoints; with
    none they answer 503 unless ``insecure_no_auth``. ``app.state.store`` is the :class:`Store`. A workload's
    recommendation is answered from memory for ``recommend_cache_s`` seconds, then refreshed in the background
    (:mod:`tuner.api.answer_cache`; 0: computed for every request). ``freeze_gc``: :func:`freeze_startup_objects` at
    start-up (for a server process; ``dstune serve`` sets it). ``request_budget_s``: the most seconds ``/v1/estimate``
    and ``/v1/recommend`` wait for their computation before answering 503 with Retry-After (:mod:`tuner.api.budget`;
    0: no budget)."""
    app = FastAPI(
        lifespan=_lifespan,
        title="dstune",
        summary="DeepSpeed config tuning: estimates, recommendations, studies and tuning jobs.",
        version="1",
    )
    # larger bodies answer 413, by Content-Length or counted while read, in JSON as every other error
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_body_bytes)
    app.add_middleware(JsonTooLarge)
    app.state.store = Store.open(store_url)
    app.state.token = token
    app.state.insecure_no_auth = insecure_no_auth
    app.state.freeze_gc = freeze_gc
    app.state.request_budget_s = request_budget_s
    app.state.recommend_cache = AnswerCache(
        recommend_cache_s, max_stale_s=max(60.0, recommend_cache_s), cache_errors=(NoFeasibleConfig, FieldError)
    )
    app.state.expensive_cache = AnswerCache(  # seq_len "max": computed once, kept, a bounded number at once
        max(EXPENSIVE_TTL_S, recommend_cache_s),
        max_stale_s=max(EXPENSIVE_STALE_S, recommend_cache_s),
        cache_errors=(NoFeasibleConfig, FieldError, NoLengthFits),
        slots=Slots(),
    )
    for retry_later in (ProfilePending, ProfileQueueFull, OverBudget, Busy):
        app.add_exception_handler(retry_later, _retry_later)
    register_unavailable(app)  # the database down: 503 with Retry-After, not 500
    register_invalid(app)  # 422 even for input holding NaN or Infinity
    register_degraded(app)  # a full disk: 503 with Retry-After, and /healthz says degraded
    register_methods(app)  # 405 with every method of the path in Allow
    for router in ROUTERS:
        app.include_router(router)
    try:  # the dashboard's pages, when that package is installed alongside
        from tuner.dashboard import router as dashboard_router
    except ImportError:
        pass
    else:
        app.include_router(dashboard_router)
    return app


def create_app_from_env() -> FastAPI:
    """:func:`create_app` configured by the environment ``dstune serve --workers N`` sets for each worker process:
    ``DSTUNE_STORAGE``, ``DSTUNE_API_TOKEN``, ``DSTUNE_INSECURE_NO_AUTH`` (``1``), ``DSTUNE_MAX_BODY_BYTES``,
    ``DSTUNE_RECOMMEND_CACHE_S`` and ``DSTUNE_REQUEST_BUDGET_S``."""
    from tuner import env

    settings = env.current()
    return create_app(
        env.storage_url(),
        settings.api_token or None,
        insecure_no_auth=settings.insecure_no_auth,
        max_body_bytes=settings.max_body_bytes,
        recommend_cache_s=settings.recommend_cache_s,
        freeze_gc=True,
        request_budget_s=settings.request_budget_s,
    )


__all__ = [
    "EstimateRequest",
    "EstimateResponse",
    "RecommendRequest",
    "RecommendResponse",
    "create_app",
    "create_app_from_env",
    "freeze_startup_objects",
]
