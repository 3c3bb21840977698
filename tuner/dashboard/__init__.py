"""The dashboard: server-rendered pages over the results store, served by the same FastAPI app as the API.

Include :data:`router` in an app whose ``app.state.store`` is a :class:`tuner.storage.Store`:

    >>> from fastapi import FastAPI
    >>> from tuner.dashboard import router
    >>> app = FastAPI()
    >>> app.include_router(router)

Pages: ``GET /`` (every workload with its best config), ``GET /studies/{name}`` (charts, predicted against measured
throughput, the sortable trial table), ``GET /studies/{name}/trials/{number}/ds_config.json`` (a trial's ds_config as
an attachment) and ``GET /static/...``.
Charts are drawn client-side by Chart.js, vendored in ``static/`` (MIT, license alongside), so no page needs internet.
"""

from tuner.dashboard._routes import router

__all__ = ["router"]
