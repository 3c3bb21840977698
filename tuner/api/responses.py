"""The answers each operation gives besides its success, for the OpenAPI schema (FastAPI's ``responses=``): every
status the server returns is listed, with FastAPI's ``{"detail": "..."}`` body. 422 (bad input) FastAPI lists
itself for operations with parameters or a body.

Example:
    >>> sorted(answers(BODY, AUTH))
    [400, 401, 403, 413, 503]
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


class ErrorOut(BaseModel):
    """FastAPI's error body."""

    detail: str


def _answer(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"model": ErrorOut, "description": description}
    if headers:
        answer["headers"] = headers
    return answer


UNAVAILABLE = {
    503: _answer(
        "The database is out of reach, the disk is full, a new model's profile or an answer past the request's time "
        "budget is still being computed, or the profiling queue is full: retry after Retry-After seconds.",
        RETRY_AFTER,
    )
}
BODY = {
    400: _answer("The body could not be read (a malformed form or stream)."),
    413: _answer("The body is larger than the server takes (dstune serve --max-body-bytes)."),
}
AUTH = {
    401: _answer("No bearer token."),
    403: _answer("A wrong bearer token."),
    503: UNAVAILABLE[503] | {"description": UNAVAILABLE[503]["description"] + " Or the server has no API token."},
}
READER = {403: _answer("A wrong bearer token (without one: the public view, tuner.api.readers).")}
NOT_FOUND = {404: _answer("No such study or job.")}


def answers(*groups: dict[int, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The groups' answers merged, with the unavailable (503) answer every operation can give."""
    merged: dict[int | str, dict[str, Any]] = {}
    for group in (UNAVAILABLE, *groups):
        for status, answer in group.items():
            merged[status] = answer
    return merged


__all__ = ["AUTH", "BODY", "NOT_FOUND", "READER", "UNAVAILABLE", "ErrorOut", "answers"]
