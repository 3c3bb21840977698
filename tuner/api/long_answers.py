"""One way for ``/v1/estimate`` and ``/v1/recommend`` to serve an expensive answer (``seq_len: "max"``): computed
once per canonical request, kept, started only with a free slot of its client's (:mod:`tuner.api.answer_cache`,
:mod:`tuner.api.slots`), and a 503 that says when to come back.

- **The key** (:func:`request_key`) is the request as given, canonical: the fields the client set (a field given
  with its default value pins it; left out it is searched), every object's keys sorted. The same question in another
  key order or spacing is the same answer; a pinned ``stage: 0`` and no stage are two.
- **The client** (:func:`client_of`): a request with the server's token is the token's client, any other its remote
  address (a wrong token counts as none: making up tokens buys no slots). One address cannot hold the token
  holder's slot, nor the token holder an address's.
- **Past the budget** (:mod:`tuner.api.budget`): 503 with ``Retry-After`` from the durations of recent computations
  less what this one has run (:meth:`tuner.api.answer_cache.AnswerCache.retry_after`), as is a refusal for want
  of a slot.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from tuner.api.answer_cache import AnswerCache
from tuner.api.budget import OverBudget, within

T = TypeVar("T")
TOKEN_CLIENT = "token"


def request_key(kind: str, body: BaseModel) -> str:
    """``kind`` and the body's set fields as canonical JSON (sorted keys, no spaces).

    Example:
        >>> from tuner.api.schemas import EstimateRequest
        >>> one = EstimateRequest.model_validate({"workload": {"model": "gpt2", "seq_len": "max"}, "stage": 0})
        >>> two = EstimateRequest.model_validate({"stage": 0, "workload": {"seq_len": "max", "model": "gpt2"}})
        >>> request_key("estimate", one) == request_key("estimate", two)
        True
        >>> three = EstimateRequest.model_validate({"workload": {"model": "gpt2", "seq_len": "max"}})
        >>> request_key("estimate", one) == request_key("estimate", three)  # stage pinned, stage searched
        False
    """
    given = body.model_dump(mode="json", exclude_unset=True)
    return f"{kind}:{json.dumps(given, sort_keys=True, separators=(',', ':'), ensure_ascii=False)}"


def client_of(request: Request) -> str:
    """Whose slots a request takes: :data:`TOKEN_CLIENT` with the server's token, else its remote address."""
    expected = request.app.state.token
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if expected and scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), expected.encode()):
        return TOKEN_CLIENT
    return f"address:{request.client.host if request.client else ''}"


async def answer_once(request: Request, kind: str, body: BaseModel, compute: Callable[[], T]) -> T:
    """``compute()``'s answer for this request, from the app's ``expensive_cache`` (computed once per
    :func:`request_key`, with a slot of :func:`client_of`'s), within the request's budget: past it
    :class:`OverBudget` whose ``retry_after`` is when the computation is expected to end."""
    cache: AnswerCache[T] = request.app.state.expensive_cache
    key = request_key(kind, body)
    try:
        return await within(cache.get(key, compute, client_of(request)), request.app.state.request_budget_s)
    except OverBudget:
        raise OverBudget(request.app.state.request_budget_s, cache.retry_after(key)) from None


__all__ = ["TOKEN_CLIENT", "answer_once", "client_of", "request_key"]
