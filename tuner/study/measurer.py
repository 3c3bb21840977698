"""What the tuning loop needs from measurement: a small interface, so its logic can be tested with a fake.

:class:`tuner.measure.dispatch.Dispatcher` (runs on Ray or local processes) satisfies it as it is; the loop never
imports it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from tuner.measure.measurement import Measurement, StepHook
from tuner.workload import TrialConfig, Workload


@runtime_checkable
class Measurer(Protocol):
    """Measures configs concurrently: up to ``slots`` runs at once, each a future holding its Measurement.

    A run that was killed by :meth:`cancel` ends with a measurement whose ``exception_type`` is
    :data:`tuner.measure.measurement.CANCELLED` (or its future is cancelled before it started).
    """

    slots: int  # how many runs the loop keeps in flight at most

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        """Start measuring ``trial`` on ``workload``. ``on_step``, when given, is called with the run's timed step
        times so far while it goes on; when it answers True the run is stopped and its measurement is ``ok`` with
        ``stopped_early`` and its partial figures."""
        ...

    def cancel(self) -> None:
        """Kill every run in flight at once and accept no more."""
        ...
