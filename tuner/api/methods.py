"""405 answers that list every method of the path: FastAPI makes one route per method, and Starlette's 405 names
only the first route whose path matched (``Allow: POST`` for ``/v1/jobs``, which also answers GET).
:func:`register` answers 405 with ``Allow`` holding the methods of every route on that path."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from tuner.api.invalid import unparsable_body


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the schema's operations on ``path`` answer (the schema lists every route of the API)."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if compile_path(template)[0].match(path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    unparsable = unparsable_body(error)  # a body nested past the JSON parser's limit: 422, as other bad input
    if unparsable is not None:
        return unparsable
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.url.path)) or headers.get("Allow", "")
    return JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=headers)


def register(app: FastAPI) -> None:
    """Answer HTTP errors on ``app`` as FastAPI does, with a complete ``Allow`` on 405."""
    app.add_exception_handler(StarletteHTTPException, _http_error)


__all__ = ["allowed_methods", "register"]
