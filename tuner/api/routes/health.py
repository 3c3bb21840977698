"""``GET /healthz``: the server and its database answer, and no recent environment failure (a full disk) degrades
it (:mod:`tuner.api.degraded`: then 503 with ``status: degraded`` and why)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tuner.api.degraded import RETRY_AFTER_S, degraded_reason
from tuner.api.deps import StoreDep
from tuner.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=Health,
    response_model_exclude_none=True,
    responses={503: {"model": Health, "description": "Degraded: a recent write failed for want of disk."}},
)
def healthz(request: Request, store: StoreDep) -> Health | JSONResponse:
    """Liveness and database reachability; 503 ``degraded`` while a recent write failed for want of disk."""
    store.list_jobs(limit=1)
    database = store.engine.dialect.name
    reason = degraded_reason(request.app)
    if reason is not None:
        body = Health(status="degraded", database=database, detail=reason).model_dump()
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
    return Health(status="ok", database=database, detail=None)
