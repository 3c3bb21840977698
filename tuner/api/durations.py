"""How long the long computations take, and when the running ones started: the ``Retry-After`` a 503 says.

A client told "retry in 5 s" about an answer that takes 40 s asks eight times for nothing; one told "retry in 40 s"
about an answer that is nearly done waits for nothing. :class:`Durations` keeps the durations of the last
:data:`KEEP` computations and the start of each one running, and answers how long until one is expected to end:
the median of the recent durations less what it has run so far (at least 1 s). With no duration known yet it says
``default_s``; one running past the median is expected within a quarter of what it has run so far (it is longer
than usual: its end is not known, but asking much more often than that only costs requests).

Example:
    >>> now = [100.0]
    >>> durations = Durations(default_s=5, clock=lambda: now[0])
    >>> durations.retry_after("a")  # nothing known, nothing running
    5
    >>> durations.started("a"); now[0] += 40; durations.finished("a")
    >>> durations.started("b"); now[0] += 10
    >>> durations.retry_after("b"), durations.retry_after()  # 40 s usually, 10 s run: about 30 s left
    (30, 30)
    >>> now[0] += 60; durations.retry_after("b")  # 70 s run, past the usual 40 s
    18
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable

KEEP = 32  # the durations the median is taken over
MAX_RETRY_AFTER_S = 600


class Durations:
    """Durations of recent computations and the starts of those running, by key (see the module docstring)."""

    def __init__(self, default_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.default_s, self.clock = default_s, clock
        self._recent: deque[float] = deque(maxlen=KEEP)
        self._running: dict[str, float] = {}

    def started(self, key: str) -> None:
        """A computation of ``key`` starts now."""
        self._running[key] = self.clock()

    def finished(self, key: str) -> None:
        """The computation of ``key`` ended (answered, failed or refused: each took its time)."""
        start = self._running.pop(key, None)
        if start is not None:
            self._recent.append(self.clock() - start)

    def retry_after(self, key: str | None = None) -> int:
        """Whole seconds until the computation of ``key`` is expected to end (``None``: the first of those running
        to end, as when every slot is taken), between 1 and :data:`MAX_RETRY_AFTER_S`; ``default_s`` when nothing
        is running or no duration is known yet."""
        now = self.clock()
        starts = list(self._running.values()) if key is None else [self._running[key]] if key in self._running else []
        if not starts or not self._recent:
            return self.default_s
        usual = statistics.median(self._recent)
        left = min(usual - (now - start) if now - start < usual else (now - start) / 4 for start in starts)
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(left)))


__all__ = ["KEEP", "MAX_RETRY_AFTER_S", "Durations"]
