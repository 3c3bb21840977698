"""Bad input as 422 whatever it holds: FastAPI's own answer echoes each error's ``input``, and an input holding
``NaN`` or ``Infinity`` (or ``1e400``, which parses as infinity) cannot be written as JSON: the answer was a 500.
:func:`register` installs the same ``{"detail": [{"loc", "msg", "type", "input"}]}`` answer with every non-finite
number in it written as a string (``"nan"``, ``"inf"``).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its text (nested objects and lists too)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


async def _unprocessable(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return JSONResponse({"detail": json_safe(jsonable_encoder(error.errors()))}, status_code=422)


def register(app: FastAPI) -> None:
    """Answer bad input on ``app`` with a 422 that is always valid JSON."""
    app.add_exception_handler(RequestValidationError, _unprocessable)


__all__ = ["json_safe", "register"]
