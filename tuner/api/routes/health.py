"""``GET /healthz``: the server and its database answer."""

from __future__ import annotations

from fastapi import APIRouter

from tuner.api.deps import StoreDep
from tuner.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(store: StoreDep) -> Health:
    """Liveness and database reachability."""
    store.list_jobs(limit=1)
    return Health(status="ok", database=store.engine.dialect.name)
