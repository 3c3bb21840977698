"""At most so many long computations at once, per server and per client: a request that would start one more gets
:class:`Busy` (503 with Retry-After) before any work starts.

A computation in a worker thread cannot be stopped from outside, and it holds a thread and the GIL until it ends,
even after its client went away (:mod:`tuner.api.budget`). So the expensive answers (``seq_len: "max"``) start only
while a slot is free: :data:`PER_SERVER` in each server process and :data:`PER_CLIENT` for each client (the token's
holder, or a remote address: :func:`tuner.api.long_answers.client_of`); a request for an answer already being
computed joins it without a slot (:mod:`tuner.api.answer_cache`).

Example:
    >>> slots = Slots(per_server=2, per_client=1)
    >>> slots.take("10.0.0.1"), slots.take("10.0.0.1"), slots.take("10.0.0.2"), slots.take("10.0.0.3")
    (True, False, True, False)
    >>> slots.give("10.0.0.1"); slots.take("10.0.0.3")
    True
"""

from __future__ import annotations

import threading
from collections import Counter

PER_SERVER = 2
PER_CLIENT = 1
RETRY_AFTER_S = 10


class Busy(Exception):
    """Every slot is taken: nothing was started; retry after ``retry_after`` seconds."""

    def __init__(self, reason: str, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(f"{reason}; nothing was started, retry in {retry_after} s")
        self.retry_after = retry_after


class Slots:
    """Slots for long computations: ``per_server`` in all, ``per_client`` for each client."""

    def __init__(self, per_server: int = PER_SERVER, per_client: int = PER_CLIENT) -> None:
        if per_server < 1 or per_client < 1:
            raise ValueError("need at least one slot per server and per client")
        self.per_server, self.per_client = per_server, per_client
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, client: str) -> bool:
        """Take a slot for ``client``; False (nothing taken) when the server's or the client's are all taken."""
        with self._lock:
            if sum(self._held.values()) >= self.per_server or self._held[client] >= self.per_client:
                return False
            self._held[client] += 1
            return True

    def give(self, client: str) -> None:
        """Give back a slot ``client`` took."""
        with self._lock:
            self._held[client] -= 1
            if self._held[client] <= 0:
                del self._held[client]

    def refusal(self, client: str, retry_after: int = RETRY_AFTER_S) -> Busy:
        """Why ``client`` got no slot, as the error to raise (retry in ``retry_after`` seconds)."""
        with self._lock:
            mine = self._held.get(client, 0)
        if mine >= self.per_client:
            return Busy(
                f"this client already has {mine} long computation(s) running (at most {self.per_client})", retry_after
            )
        return Busy(
            f"this server already runs {self.per_server} long computations (at most {self.per_server})", retry_after
        )

    @property
    def held(self) -> int:
        """Slots taken now."""
        with self._lock:
            return sum(self._held.values())


__all__ = ["PER_CLIENT", "PER_SERVER", "Busy", "Slots"]
