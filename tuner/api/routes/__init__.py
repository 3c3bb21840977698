"""One APIRouter per resource: health, estimate, recommend, studies and jobs (included in that order by
:func:`tuner.api.app.create_app`, which is the order of the OpenAPI schema's paths)."""

from tuner.api.routes import estimate, health, jobs, recommend, studies

ROUTERS = (health.router, estimate.router, recommend.router, studies.router, jobs.router)

__all__ = ["ROUTERS"]
