"""What one term of the memory model contributes to an estimate (:data:`Contribution`), and the one place the
contributions are combined into a step's phases (:class:`Ledger`).

A term (a model state, an activation, a transient buffer, a layout's share) returns its contribution: a tuple of
entries, each immutable. :func:`held` is bytes alive in some phases of a step, :func:`detail` a named figure the
estimate reports (``MemoryEstimate.details``), :func:`transient` a buffer allocated for a moment inside one phase
(:mod:`.transients`), and :class:`Pinned` the page-locked host bytes among them (:mod:`.pinned`). A term that needs
what an earlier one recorded (the reduce copy beside a recomputed layer, the gradients already in a phase) reads the
ledger's phases and details: it never writes them.

Example:
    >>> ledger = Ledger(("forward", "backward", "step"))
    >>> ledger.record(held("gpu", "parameters", 10) + transient("reduce_copy", "backward", 4) + detail("x", 1))
    >>> ledger.phases["backward"].gpu["buffers"], ledger.details
    (4, {'reduce_copy': 4, 'transients_backward': 4, 'x': 1})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from tuner.estimator.phases import PHASES, Phase


class Held(NamedTuple):
    """``size`` bytes of ``category`` on the device (``where="gpu"``) or the host (``"cpu"``) in the phases
    ``only`` that the estimate has."""

    where: str
    category: str
    size: int
    only: tuple[str, ...]


class Detail(NamedTuple):
    """A named figure of the estimate (``MemoryEstimate.details``)."""

    name: str
    size: int


class Transient(NamedTuple):
    """A transient buffer of ``size`` device bytes at its worst moment in ``phase`` (:mod:`.transients`)."""

    name: str
    phase: str
    size: int


class Pinned(NamedTuple):
    """Page-locked host bytes as allocated, and what the power-of-two rounding adds to them (:mod:`.pinned`)."""

    size: int
    rounding: int


Entry = Held | Detail | Transient | Pinned
Contribution = tuple[Entry, ...]
NOTHING: Contribution = ()


_new = tuple.__new__  # builds an entry in C, without its class's Python-level __new__ (a term makes thousands a second)


def held(where: str, category: str, size: int, only: tuple[str, ...] = PHASES) -> Contribution:
    """``size`` bytes of ``category`` held on ``where`` in the phases ``only`` (default: all of them, for what stays
    allocated throughout); nothing when it is none."""
    return (_new(Held, (where, category, size, only)),) if size else NOTHING


def detail(name: str, size: int) -> Contribution:
    """The named figure ``name`` of the estimate."""
    return (_new(Detail, (name, size)),)


def details(sizes: Mapping[str, int]) -> Contribution:
    """Each of ``sizes`` as a named figure of the estimate, in their order."""
    return tuple([_new(Detail, item) for item in sizes.items()])


def transient(name: str, phase: str, size: int) -> Contribution:
    """A transient buffer of ``size`` bytes at its worst moment in ``phase``; nothing when it is empty."""
    return (_new(Transient, (name, phase, size)),) if size else NOTHING


class Ledger:
    """The phases and details of one estimate, combined from the terms' contributions in the order they come."""

    __slots__ = ("_throughout", "details", "phases", "pinned", "rounding")

    def __init__(self, phases: tuple[str, ...]) -> None:
        self.phases = {name: Phase() for name in phases}
        self.details: dict[str, int] = {}
        self.pinned = 0
        self.rounding = 0
        # what held bytes in every phase (the default ``only``, most entries) add to, where by where
        every = self.phases.values()
        self._throughout = {"gpu": [phase.gpu for phase in every], "cpu": [phase.cpu for phase in every]}

    def record(self, contribution: Contribution) -> None:
        """Add one term's contribution."""
        phases, details = self.phases, self.details
        for entry in contribution:
            if type(entry) is Held:
                where, category, size, only = entry
                if only is PHASES:
                    for categories in self._throughout[where]:
                        categories[category] += size
                    continue
                for name in only:
                    phase = phases.get(name)
                    if phase is not None:
                        getattr(phase, where)[category] += size
            elif type(entry) is Detail:
                details[entry.name] = entry.size
            elif type(entry) is Transient:
                name, at, size = entry
                details[name] = size
                key = f"transients_{at}"
                details[key] = details.get(key, 0) + size
                phase = phases.get(at)
                if phase is not None:
                    phase.gpu["buffers"] += size
            elif type(entry) is Pinned:
                self.pinned += entry.size
                self.rounding += entry.rounding
            else:
                raise TypeError(f"not an entry of a contribution: {entry!r}")


__all__ = [
    "NOTHING",
    "Contribution",
    "Detail",
    "Entry",
    "Held",
    "Ledger",
    "Pinned",
    "Transient",
    "detail",
    "details",
    "held",
    "transient",
]
