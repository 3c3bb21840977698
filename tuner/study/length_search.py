"""The longest sequence that fits, by measurement: the lengths to measure, from the estimator's answer to a bracket
of a measured fit and a measured overflow one step apart (pure logic; ``dstune tune --seq-len max``).

Memory grows with the length, so the lengths that fit are a prefix. The search starts where the estimator says the
longest fit is (:func:`tuner.forecast.longest_fit`) and measures there. If that fits it gallops up (one step, then
two, four...) until a run does not fit; if it does not fit it gallops down until one does. Then it bisects the gap
between the longest measured fit and the shortest measured overflow, to one step (the layout's multiple: 256, or
what sequence parallelism requires). An estimator within a few percent costs two runs: its answer, measured to fit,
and one step more, measured over.

It ends ``bracketed`` (the answer fits and one step more was measured over), at the ``cap`` (the answer is the
longest length searched), at the ``floor`` (even one step does not fit), out of ``budget`` (runs), or ``failed``
(a run ended neither fitting nor over: an error or a timeout says nothing about memory, so the search stops there
rather than guess). Measuring goes through a callable, so the logic runs with a fake.

Example:
    >>> fake = lambda n: Probe(n, "fits" if n <= 1280 else "over")
    >>> found = search_length(1024, 256, 1 << 20, fake, runs=10)
    >>> found.longest, found.above, found.ended, [p.seq_len for p in found.probes]
    (1280, 1536, 'bracketed', [1024, 1280, 1792, 1536])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["fits", "over", "failed"]
Ended = Literal["bracketed", "cap", "floor", "budget", "failed"]


@dataclass(frozen=True)
class Probe:
    """One measured length: ``fits`` (trained, its peak within the memory), ``over`` (out of memory, or its peak
    above it) or ``failed`` (anything else: ``note`` says what), with what the measurement gives to show."""

    seq_len: int
    verdict: Verdict
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class LengthSearch:
    """The outcome: the longest length measured to fit (None: none did), the shortest measured not to fit above it
    (None: none was, or not yet), how the search ended and every probe in the order measured."""

    longest: int | None
    above: int | None
    ended: Ended
    step: int
    cap: int
    probes: tuple[Probe, ...]

    @property
    def runs(self) -> int:
        """How many lengths were measured."""
        return len(self.probes)

    def probe(self, seq_len: int) -> Probe | None:
        """The probe at ``seq_len``, if measured."""
        return next((p for p in self.probes if p.seq_len == seq_len), None)


class _OutOfRuns(Exception):
    pass


class _Failed(Exception):
    pass


class _Search:
    def __init__(self, step: int, measure: Callable[[int], Probe], runs: int) -> None:
        self.step, self.measure, self.runs = step, measure, runs
        self.probes: list[Probe] = []
        self.low: int | None = None  # the longest measured fit
        self.high: int | None = None  # the shortest measured overflow

    def fits(self, seq_len: int) -> bool:
        """Measure ``seq_len`` (in steps) and move the bounds."""
        if len(self.probes) >= self.runs:
            raise _OutOfRuns
        probe = self.measure(seq_len * self.step)
        self.probes.append(probe)
        if probe.verdict == "failed":
            raise _Failed
        if probe.verdict == "fits":
            self.low = seq_len if self.low is None else max(self.low, seq_len)
            return True
        self.high = seq_len if self.high is None else min(self.high, seq_len)
        return False

    def gallop(self, start: int, top: int) -> Ended | None:
        """From ``start`` (in steps), up while runs fit or down while they do not, until a bound on each side;
        ``cap`` or ``floor`` when the search reaches an end first."""
        stride = 1
        if self.fits(start):
            while self.low is not None and self.high is None:
                if self.low >= top:
                    return "cap"
                self.fits(min(self.low + stride, top))
                stride *= 2
            return None
        while self.low is None and self.high is not None:
            if self.high <= 1:
                return "floor"
            self.fits(max(self.high - stride, 1))
            stride *= 2
        return None

    def bisect(self) -> None:
        """Halve the gap between the bounds until they are one step apart."""
        while self.low is not None and self.high is not None and self.high - self.low > 1:
            self.fits((self.low + self.high) // 2)


def search_length(start: int, step: int, cap: int, measure: Callable[[int], Probe], runs: int) -> LengthSearch:
    """The longest multiple of ``step`` up to ``cap`` that ``measure`` says fits, starting at ``start`` (module
    docstring); at most ``runs`` measurements.

    Args:
        start: The estimator's answer (rounded down to a multiple of ``step``; at least one step, at most the cap).
        step: The granularity: lengths measured are its multiples.
        cap: The longest length considered (the model's learned positions, or the search's cap).
        measure: Measures one length and says whether it fits.
        runs: The most lengths measured.
    """
    if step < 1 or cap < step or runs < 1:
        raise ValueError(f"need step >= 1, cap >= step and runs >= 1 (step {step}, cap {cap}, runs {runs})")
    top = cap // step
    search = _Search(step, measure, runs)
    ended: Ended = "bracketed"
    try:
        ended = search.gallop(min(max(1, start // step), top), top) or "bracketed"
        if ended == "bracketed":
            search.bisect()
    except _OutOfRuns:
        ended = "budget"
    except _Failed:
        ended = "failed"
    return LengthSearch(
        longest=None if search.low is None else search.low * step,
        above=None if search.high is None else search.high * step,
        ended=ended,
        step=step,
        cap=top * step,
        probes=tuple(search.probes),
    )


__all__ = ["Ended", "LengthSearch", "Probe", "Verdict", "search_length"]
