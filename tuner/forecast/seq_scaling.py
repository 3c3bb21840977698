"""A workload at any sequence length, for searches over the length (:mod:`tuner.forecast.longest`).

A built-in model's (or a bare count's) activations are formulas of the length: only ``train.seq_len`` changes. A
transformers model's come from its traced profile, one entry per traced length; tracing every length a search probes
would cost a second each (and torch), so :class:`SeqSizer` traces none: it fits each entry's byte counts through the
lengths the profile holds and evaluates the fit at the length asked. What autograd saves is a polynomial of degree at
most 2 in the sequence length (linear with SDPA/flash attention, quadratic with eager attention's score matrix;
measured exact: Llama-3-8B's entries at 1,024, 2,048, 4,096 and 32,768 tokens are proportional), so three traced
lengths (:data:`TRACE_LENGTHS`) determine it exactly; with two the fit is linear, with one proportional.

The sizer adds entries at the length asked and at the lengths per rank of the sequence-parallel degrees given
(``s / sp``), so an estimator that looks up the length per rank finds it. Pure Python.

Example:
    >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
    >>> sizer = SeqSizer(Workload(load_builtin_model("llama-2-7b"), ClusterSpec()))
    >>> sizer.at(65536).train.seq_len
    65536
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from fractions import Fraction
from typing import Any

from tuner.workload import ActivationProfile, Linear, Workload

TRACE_LENGTHS = (1024, 2048, 4096)  # the lengths a transformers model is traced at for a search over the length
Group = tuple[str, str, str, bool, str]  # an entry's settings but the length: precision, attention, experts...


def _fit(points: list[tuple[int, int]], length: int) -> int:
    """The polynomial through ``points`` (length, bytes; at most three: degree 2) at ``length``, rounded, >= 0."""
    if len(points) == 1:
        (x0, y0) = points[0]
        return max(0, round(Fraction(y0 * length, x0)))
    total = Fraction(0)
    for i, (xi, yi) in enumerate(points):
        term = Fraction(yi)
        for j, (xj, _) in enumerate(points):
            if j != i:
                term *= Fraction(length - xj, xi - xj)
        total += term
    return max(0, round(total))


def _fit_linear(parts: list[tuple[int, Linear]], length: int) -> Linear:
    """A :class:`Linear` (bytes as a function of the micro-batch) at ``length``, each field fitted separately."""
    fixed = _fit([(s, part.fixed) for s, part in parts], length)
    per_sample = _fit([(s, part.per_sample) for s, part in parts], length)
    singles = [(s, part.single) for s, part in parts if part.single is not None]
    single = _fit([(s, value) for s, value in singles], length) if len(singles) == len(parts) else None
    return Linear(fixed, per_sample, single)


class SeqSizer:
    """``workload`` at other sequence lengths (:meth:`at`), its traced profile extrapolated (module docstring)."""

    def __init__(self, workload: Workload, per_rank_divisors: Iterable[int] = (1,)) -> None:
        self.workload = workload
        self.divisors = tuple(sorted({d for d in per_rank_divisors if d >= 1} | {1}))
        self._groups: dict[Group, list[ActivationProfile]] = {}
        profile = workload.profile
        for entry in profile.activations if profile is not None else ():
            key = (entry.precision, entry.attention, entry.experts, entry.checkpointing, entry.adapters)
            self._groups.setdefault(key, []).append(entry)
        for entries in self._groups.values():
            entries.sort(key=lambda entry: entry.seq_len)
        self._cache: dict[int, Workload] = {}

    @property
    def traced_lengths(self) -> tuple[int, ...]:
        """The distinct lengths the profile was traced at (empty: formulas, or no profile)."""
        return tuple(sorted({entry.seq_len for group in self._groups.values() for entry in group}))

    def at(self, seq_len: int) -> Workload:
        """The workload at ``seq_len`` tokens (cached: searches ask a length again)."""
        found = self._cache.get(seq_len)
        if found is None:
            found = self._build(seq_len)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[seq_len] = found
        return found

    def _build(self, seq_len: int) -> Workload:
        work = self.workload
        moved = replace(work, train=replace(work.train, seq_len=seq_len))
        if not self._groups or work.profile is None:
            return moved
        lengths = sorted({seq_len // d for d in self.divisors if seq_len % d == 0})
        entries = tuple(self._entry(group, length) for group in self._groups.values() for length in lengths)
        return replace(moved, profile=work.profile.with_activations(entries))

    @staticmethod
    def _entry(group: list[ActivationProfile], length: int) -> ActivationProfile:
        """The group's entry at ``length``: traced when it was, else fitted through (up to) three traced lengths."""
        for entry in group:
            if entry.seq_len == length:
                return entry
        basis = _basis(group)
        kinds = basis[0].layers.keys()
        fitted: dict[str, Any] = {
            name: _fit_linear([(e.seq_len, getattr(e, name)) for e in basis], length)
            for name in ActivationProfile.linear_fields()
        }
        return replace(
            basis[0],
            seq_len=length,
            layers={kind: _fit_linear([(e.seq_len, e.layers[kind]) for e in basis], length) for kind in kinds},
            **fitted,
        )


def _basis(group: list[ActivationProfile]) -> list[ActivationProfile]:
    """Up to three entries of distinct lengths, the largest ones (closest to the long lengths searched)."""
    by_length = {entry.seq_len: entry for entry in group}
    return [by_length[length] for length in sorted(by_length)[-3:]]


__all__ = ["TRACE_LENGTHS", "SeqSizer"]
