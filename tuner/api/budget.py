"""A time budget per request: the most seconds a client waits for an answer that is computed in a worker thread.

Validation bounds what any one request may cost (:mod:`tuner.requests`: dimensions, world size, parameter count), so
every computation ends; the budget bounds how long a client waits for it on a busy server. Past the budget the
client gets **503 with Retry-After** (not 422: the request is valid, the server is short of time now). The
computation is not abandoned: a worker thread cannot be stopped from outside, and :mod:`tuner.api.answer_cache`
keeps computing (shielded) and stores the answer, so the retry is answered from memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
RETRY_AFTER_S = 5


class OverBudget(Exception):
    """The answer took longer than the request's budget; it is still being computed."""

    def __init__(self, budget_s: float, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(f"the answer takes longer than this server's {budget_s:g} s budget; retry in {retry_after} s")
        self.retry_after = retry_after


async def within(awaitable: Awaitable[T], budget_s: float) -> T:
    """``await awaitable``, or :class:`OverBudget` after ``budget_s`` seconds (0: no budget)."""
    if budget_s <= 0:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, budget_s)
    except TimeoutError:
        raise OverBudget(budget_s) from None


__all__ = ["RETRY_AFTER_S", "OverBudget", "within"]
