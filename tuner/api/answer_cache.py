"""An asyncio cache for answers that are costly to compute and may be a few seconds old: stale-while-revalidate with
one computation per key at a time.

``/v1/recommend`` answers from it (``bench/api_load.py``): a recommendation changes only when a trial finishes, so
an answer up to ``ttl_s`` old is served straight from memory, without a thread hop or a database query.

- **fresh** (computed less than ``ttl_s`` ago): returned at once;
- **stale** (older, but less than ``max_stale_s``): returned at once, and one refresh starts in a worker thread;
  while the refresh fails (database unreachable), the stale answer keeps being served until ``max_stale_s``;
- **missing** (or too stale): computed in a worker thread, once, however many requests wait for it.

An answer is stamped when its computation ends, so one that took longer than ``ttl_s`` is fresh for its whole
``ttl_s`` too. With ``slots`` (:class:`tuner.api.slots.Slots`), a computation starts only with a free slot of the
client's: a miss without one raises :class:`tuner.api.slots.Busy` before anything starts, a stale answer is served
without its refresh; joining a computation in progress needs no slot.

:meth:`AnswerCache.retry_after` says when a computation is expected to end (:class:`tuner.api.durations.Durations`):
the ``Retry-After`` of a 503 for an answer still computed, or for a miss that found no slot.

Errors of the types in ``cache_errors`` are answers too (cached and raised to every caller); other errors are not
cached and reach the callers that waited for that computation. ``ttl_s == 0`` computes on every call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from tuner.api.durations import Durations
from tuner.api.slots import Slots

T = TypeVar("T")


class AnswerCache(Generic[T]):
    """Answers by key, computed by a blocking function in a worker thread (see the module docstring)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        max_stale_s: float = 60.0,
        max_entries: int = 4096,
        cache_errors: tuple[type[Exception], ...] = (),
        clock: Callable[[], float] = time.monotonic,
        slots: Slots | None = None,
        retry_after_s: int = 5,
    ) -> None:
        if ttl_s < 0 or max_stale_s < ttl_s or max_entries < 1:
            raise ValueError("need 0 <= ttl_s <= max_stale_s and max_entries >= 1")
        self.ttl_s, self.max_stale_s, self.max_entries = ttl_s, max_stale_s, max_entries
        self.cache_errors, self.clock, self.slots = cache_errors, clock, slots
        self._entries: dict[str, tuple[float, T | Exception]] = {}
        self._computing: dict[str, asyncio.Task[T | Exception]] = {}
        self.durations = Durations(retry_after_s, clock)

    async def get(self, key: str, compute: Callable[[], T], client: str = "") -> T:
        """The answer for ``key``: cached, or ``compute()`` run in a worker thread (raises what it raised), with a
        slot of ``client``'s when the cache has slots."""
        if self.ttl_s == 0 and self.slots is None:
            return await asyncio.to_thread(compute)
        entry = self._entries.get(key)
        age = None if entry is None else self.clock() - entry[0]
        if entry is not None and age is not None and age <= self.max_stale_s:
            if age > self.ttl_s and key not in self._computing and self._slot(client):
                self._start(key, compute, client)
            return _unwrap(entry[1])
        task = self._computing.get(key)
        if task is None:
            if not self._slot(client):
                raise self.slots.refusal(client, self.retry_after())  # type: ignore[union-attr]  # only with slots
            task = self._start(key, compute, client)
        # shielded: a caller that goes away does not cancel the computation the others wait for
        return _unwrap(await asyncio.shield(task))

    def retry_after(self, key: str | None = None) -> int:
        """Seconds until the computation of ``key`` (``None``: the first running) is expected to end."""
        return self.durations.retry_after(key)

    def _slot(self, client: str) -> bool:
        return self.slots is None or self.slots.take(client)

    def _start(self, key: str, compute: Callable[[], T], client: str) -> asyncio.Task[T | Exception]:
        task = asyncio.get_running_loop().create_task(self._compute(key, compute, client))
        self._computing[key] = task
        self.durations.started(key)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # a failed refresh is not an error
        return task

    async def _compute(self, key: str, compute: Callable[[], T], client: str) -> T | Exception:
        try:
            try:
                answer: T | Exception = await asyncio.to_thread(compute)
            except self.cache_errors as error:
                answer = error
            self._entries.pop(key, None)  # re-inserted last: the oldest entries are the first out
            self._entries[key] = (self.clock(), answer)  # fresh from when it is known, however long it took
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]
            return answer
        finally:
            del self._computing[key]
            self.durations.finished(key)
            if self.slots is not None:
                self.slots.give(client)

    def clear(self) -> None:
        """Forget every answer (computations in progress still store theirs)."""
        self._entries.clear()


def _unwrap(answer: T | Exception) -> T:
    if isinstance(answer, Exception):
        raise answer.with_traceback(None)  # the same cached error, without the frames of every earlier raise
    return answer


__all__ = ["AnswerCache"]
