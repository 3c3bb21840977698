"""What the routers share: the store and the bearer-token check as FastAPI dependencies, and bad input as 422.

The app keeps its state on ``app.state`` (:func:`tuner.api.app.create_app`): ``store`` (the
:class:`tuner.storage.Store`), ``token`` and ``insecure_no_auth`` (the mutating endpoints' guard) and
``recommend_cache`` (:class:`tuner.api.answer_cache.AnswerCache`).
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from tuner.errors import InputError
from tuner.requests import FieldError, readable_name
from tuner.storage import Store

bearer = HTTPBearer(auto_error=False, description="The server's API token (dstune serve --token-file/env).")


def store_of(request: Request) -> Store:
    """The app's :class:`Store`."""
    return request.app.state.store


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """Let a request through with the server's token: 401 without one, 403 with a wrong one, 503 when the server
    has none (unless it was started ``insecure_no_auth``)."""
    expected = request.app.state.token
    if expected is None:
        if request.app.state.insecure_no_auth:
            return
        raise HTTPException(503, "mutating endpoints are disabled: the server has no API token")
    if credentials is None:
        raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(403, "invalid token")


def _study_name(name: str) -> str:
    """A study name in a path, held to :func:`tuner.requests.readable_name` (422 naming ``name``)."""
    try:
        return readable_name(name, "name")
    except InputError as error:
        raise PydanticCustomError("study_name", "{message}", {"message": error.message}) from None


def invalid(error: FieldError) -> RequestValidationError:
    """A :class:`FieldError` in the request body as FastAPI's 422 (``loc`` starts with ``body``)."""
    return RequestValidationError([{"loc": ("body", *error.loc), "msg": error.message, "type": "value_error"}])


StoreDep = Annotated[Store, Depends(store_of)]
Auth = Depends(require_token)
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=2**31)]
# the pattern says in the schema what readable_name checks: no control characters (tab, newline, return aside)
StudyName = Annotated[
    str,
    Path(min_length=1, max_length=255, pattern=r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+$"),
    AfterValidator(_study_name),
]
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]

__all__ = [
    "Auth",
    "JobId",
    "Limit",
    "Offset",
    "StoreDep",
    "StudyName",
    "bearer",
    "invalid",
    "require_token",
    "store_of",
]
