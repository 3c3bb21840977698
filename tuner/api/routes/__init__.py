"""One APIRouter per resource: health, estimate, recommend, studies and jobs, included in that order by
:func:`tuner.api.app.create_app` (the order of the OpenAPI schema's paths). Routers import :mod:`tuner.api.deps`,
:mod:`tuner.api.schemas` and the rooms below the faces; never :mod:`tuner.api.app` or each other."""

from tuner.api.routes import estimate, health, jobs, recommend, studies

ROUTERS = (health.router, estimate.router, recommend.router, studies.router, jobs.router)

__all__ = ["ROUTERS"]
