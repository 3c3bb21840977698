"""What stops the longest sequence one step further (:func:`next_limit`): the GPU's memory (or the margin beside the
peak), the node's host memory (and where a pinned buffer's power-of-two rounding is why), a learned position table,
the search's cap, or the estimator refusing the config there (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tuner.estimator import CATEGORIES, CPU_VIEWS, MemoryEstimate
from tuner.forecast.seq_candidates import Candidate
from tuner.forecast.seq_scaling import SeqSizer
from tuner.units import format_bytes
from tuner.workload import TrialConfig


class Probing(Protocol):
    """The search's probes as the next limit reads them (:class:`tuner.forecast.longest` keeps them)."""

    sizer: SeqSizer
    cap: int
    margin: float
    refusals: dict[Candidate, str]

    def probe(self, candidate: Candidate, seq_len: int) -> tuple[TrialConfig, MemoryEstimate] | None: ...


@dataclass(frozen=True)
class NextLimit:
    """What stops the answer one step further: ``memory`` ``gpu`` or ``cpu`` (``cap``: the search's cap;
    ``positions``: the model's learned position table; ``refused``: the estimator refuses the config there), the
    category that grows the most from the answer's length to ``seq_len`` (the one that runs out), the peak phase
    there and the bytes it is short by (on the GPU with the margin: the peak times 1 + margin, less the memory)."""

    seq_len: int
    memory: str
    category: str | None
    phase: str | None
    short_by: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def next_limit(search: Probing, winner: Candidate, best: int, est: MemoryEstimate) -> NextLimit:
    """What runs out one step past the answer: the memory short and the category that grew the most."""
    nxt = best + winner.multiple
    if nxt > search.cap:
        return _capped(search, best)
    found = search.probe(winner, nxt)
    if found is None:
        refusal = search.refusals.get(winner, "refused by the estimator")
        return NextLimit(nxt, "refused", None, None, 0, refusal)
    after = found[1]
    over = after.gpu_total * (1 + search.margin) - after.gpu_memory  # beyond the memory, or the margin
    if over > 0 or after.cpu_headroom >= 0:
        grown = {n: (after.per_gpu[n] or 0) - (est.per_gpu[n] or 0) for n in (*CATEGORIES, "overhead")}
        category = max(grown, key=grown.__getitem__)
        if category == "overhead":  # which of its terms (the allocator's reserve, a communicator...)
            terms = {n: size - est.overhead_terms.get(n, 0) for n, size in after.overhead_terms.items()}
            category = f"overhead: {max(terms, key=terms.__getitem__)}" if terms else category
        return NextLimit(nxt, "gpu", category, after.peak_phase, max(0, int(over)), _gpu_reason(after, search.margin))
    host = [n for n in after.cpu_per_node if n not in CPU_VIEWS]
    grown = {n: after.cpu_per_node[n] - est.cpu_per_node.get(n, 0) for n in host}
    category = max(grown, key=grown.__getitem__)
    reason = after.overflow_reason() or ""
    pinned = after.cpu_per_node.get("pinned", 0) - est.cpu_per_node.get("pinned", 0)
    if pinned > -after.cpu_headroom:  # the step itself costs more than what was left: a pinned buffer doubled
        reason += (
            f"; {winner.multiple} more tokens pin {format_bytes(pinned)} more host memory: CUDA's pinned allocator "
            "rounds each buffer up to a power of two"
        )
    return NextLimit(nxt, "cpu", category, None, -after.cpu_headroom, reason)


def _gpu_reason(after: MemoryEstimate, margin: float) -> str:
    """Why the GPU does not hold the next length: its overflow, and what the margin adds to it."""
    if not margin:
        return after.overflow_reason() or ""
    with_margin = format_bytes(int(after.gpu_total * (1 + margin) - after.gpu_memory))
    if after.headroom < 0:
        return f"{after.overflow_reason()}; {with_margin} short with the {margin:.0%} margin"
    return (
        f"the GPU holds the estimated peak ({format_bytes(after.gpu_total)} of {format_bytes(after.gpu_memory)}) "
        f"but not the {margin:.0%} margin beside it: {with_margin} short"
    )


def _capped(search: Probing, best: int) -> NextLimit:
    """The next limit where the search's cap stops it: the model's learned position table, or :data:`SEARCH_CAP`."""
    model = search.sizer.at(best).model
    if 0 < model.position_limit <= search.cap:
        reason = (
            f"the {model.position_limit:,} positions {model.name} learned (its position embedding table): no run "
            "indexes past them and no scaling extends them"
        )
        return NextLimit(best, "positions", None, None, 0, reason)
    return NextLimit(best, "cap", None, None, 0, f"the search stops at {search.cap} tokens")


__all__ = ["NextLimit", "Probing", "next_limit"]
