"""The small protocol every parallel layout implements in the estimator (:data:`tuner.estimator.layouts.LAYOUTS`):
its group on a trial's ranks, the rank's view of the model it makes, the memory terms it adds beside the model
states and beside the activations, and the time of its collectives. Each hook adds nothing by default; the
estimator calls a layout's hooks only on a trial where its group has more than one rank
(:func:`tuner.estimator.layouts.active`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from tuner.estimator.settings import Settings
from tuner.estimator.terms import NOTHING, Contribution
from tuner.estimator.throughput.hardware import Hardware
from tuner.workload import Ranks, Workload
from tuner.workload.layouts import LayoutKind


class LayoutTerms(ABC):
    """One parallel layout, as the estimator reads it."""

    kind: ClassVar[LayoutKind]  # the workload room's side of the layout (its degree, key, label)

    @abstractmethod
    def group(self, ranks: Ranks) -> int:
        """The ranks of this layout's group on a trial's ``ranks`` (1: off)."""

    def rank_view(self, workload: Workload, s: Settings) -> tuple[Workload, Contribution]:
        """The workload as one rank holds it under this layout (``workload`` itself by default), and its figures."""
        return workload, NOTHING

    def state_terms(self, numels: tuple[int, ...], s: Settings, details: Mapping[str, int]) -> Contribution:
        """What the layout adds to the model states (of the trained parameters' ``numels``), given the figures of
        the states so far (``details``)."""
        return NOTHING

    def buffer_terms(self, workload: Workload, s: Settings) -> Contribution:
        """The buffers the layout adds beside the activations (a rank's ``workload``)."""
        return NOTHING

    def collective_seconds(self, workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
        """(seconds, calls) per optimizer step of the collectives the layout adds that nothing overlaps, on
        ``hw`` (a rank's ``workload``)."""
        return 0.0, 0


__all__ = ["LayoutTerms"]
