"""Bad input as 422 whatever it holds: FastAPI's own answer echoes each error's ``input``, and an input holding
``NaN`` or ``Infinity`` (or ``1e400``, which parses as infinity) cannot be written as JSON: the answer was a 500.
:func:`register` installs the same ``{"detail": [{"loc", "msg", "type", "input"}]}`` answer with every non-finite
number in it written as a string (``"nan"``, ``"inf"``), and each echoed input cut at :data:`ECHO_DEPTH` levels (an
input nested hundreds deep made the echo itself exceed Python's recursion limit: a 500). A body the JSON parser cannot
read at all (nested past its own recursion limit) is a 422 at ``body`` too, not FastAPI's bare 400.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ECHO_DEPTH = 8  # levels of an error's input echoed back; deeper parts are "..."
PARSE_FAILED = "There was an error parsing the body"  # FastAPI's words for a body its JSON parser raised on


def json_safe(value: Any, depth: int = ECHO_DEPTH) -> Any:
    """``value`` with every non-finite float replaced by its text (nested objects and lists too), and what lies more
    than ``depth`` levels down replaced by ``"..."``.

    >>> json_safe({"a": [float("nan"), {"b": {"c": 1}}]}, depth=3)
    {'a': ['nan', {'b': '...'}]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list, tuple)) and depth <= 0:
        return "..."
    if isinstance(value, dict):
        return {key: json_safe(item, depth - 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item, depth - 1) for item in value]
    return value


async def _unprocessable(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    errors = [{**item, "input": json_safe(item["input"])} if "input" in item else item for item in error.errors()]
    return JSONResponse({"detail": json_safe(jsonable_encoder(errors))}, status_code=422)


def unparsable_body(error: StarletteHTTPException) -> JSONResponse | None:
    """FastAPI's 400 for a body its parser raised on (JSON nested past the recursion limit) as a 422 at ``body``;
    None for any other HTTP error (the app's HTTP error handler, :mod:`tuner.api.methods`, asks first)."""
    if error.status_code != 400 or error.detail != PARSE_FAILED:
        return None
    message = "the body is not JSON this server reads (nested too deep?)"
    return JSONResponse({"detail": [{"loc": ["body"], "msg": message, "type": "json_invalid"}]}, status_code=422)


def register(app: FastAPI) -> None:
    """Answer bad input on ``app`` with a 422 that is always valid JSON."""
    app.add_exception_handler(RequestValidationError, _unprocessable)


__all__ = ["json_safe", "register", "unparsable_body"]
