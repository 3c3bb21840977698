"""503 instead of 500 while the database is out of reach.

:func:`register` installs an exception handler for :class:`tuner.storage.DatabaseUnavailable` on an app made by
:func:`tuner.api.create_app`: a request that needs the database while it is down (a PostgreSQL restart) answers 503
with ``Retry-After``, and the next request after it is back is served normally (the store's connections are checked
before use). It also shortens how long the app's store waits for the database per request (``retry_s``): a client
would rather hear 503 soon and retry than hang.

Example:
    >>> import tempfile
    >>> from tuner.api import create_app
    >>> app = create_app(f"sqlite:///{tempfile.mkdtemp()}/dstune.db", token=None)
    >>> register(app)
    >>> app.state.store.retry_s
    2.0
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tuner.storage import DatabaseUnavailable

RETRY_AFTER_S = 5
REQUEST_RETRY_S = 2.0


def unavailable_response(error: DatabaseUnavailable) -> JSONResponse:
    """The 503 answer: ``{"detail": ...}`` as FastAPI's own errors, the URL without its password."""
    return JSONResponse(
        {"detail": f"database unavailable, try again shortly ({error.detail})"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def register(app: FastAPI, retry_s: float = REQUEST_RETRY_S) -> None:
    """Answer 503 for :class:`DatabaseUnavailable` on ``app``; its store retries an unreachable database for at most
    ``retry_s`` seconds per call."""

    async def handler(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, DatabaseUnavailable)
        return unavailable_response(error)

    app.add_exception_handler(DatabaseUnavailable, handler)
    store = getattr(app.state, "store", None)
    if store is not None:
        store.retry_s = retry_s


__all__ = ["RETRY_AFTER_S", "register", "unavailable_response"]
