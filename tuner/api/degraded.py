"""The environment failing under the API: a full disk (``OSError`` ENOSPC, SQLite's "database or disk is full") or
another environment failure (:mod:`tuner.storage.environment`) answers 503 with ``Retry-After``, not 500, and
``/healthz`` reports the server degraded (503, ``status: degraded`` and the reason) until :data:`DEGRADED_S` seconds
pass without another such failure. Anything else stays a server error. Both say the failure as a reader without the
token may see it (:func:`tuner.storage.public.public_error`: no server path); the server's log has it whole.
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tuner.storage.environment import environment_failure
from tuner.storage.public import public_error

RETRY_AFTER_S = 30
DEGRADED_S = 60.0  # /healthz says degraded for this long after the last environment failure
LOG = logging.getLogger(__name__)


def degraded_reason(app: FastAPI) -> str | None:
    """Why the server is degraded now (the last environment failure, if recent), or None."""
    since, reason = getattr(app.state, "degraded", (0.0, None))
    return reason if reason is not None and time.monotonic() - since < DEGRADED_S else None


async def _environment(request: Request, error: Exception) -> JSONResponse:
    failure = environment_failure(error)
    if failure is None:
        raise error  # a bug: the server error it is
    LOG.warning("answered 503: %s", failure)
    shown = public_error(str(failure))
    request.app.state.degraded = (time.monotonic(), shown)
    return JSONResponse(
        {"detail": f"the server cannot store this now ({shown}); try again later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def register(app: FastAPI) -> None:
    """Answer environment failures on ``app`` with 503 and remember them for ``/healthz``."""
    app.state.degraded = (0.0, None)
    for kind in (OSError, sa.exc.OperationalError):
        app.add_exception_handler(kind, _environment)


__all__ = ["DEGRADED_S", "RETRY_AFTER_S", "degraded_reason", "register"]
