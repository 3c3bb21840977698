"""The measuring-backend protocol: one trial in, one :class:`~tuner.measure.measurement.Measurement` out."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from tuner.measure.measurement import Measurement, StepHook
from tuner.measure.options import MeasureOptions
from tuner.workload import TrialConfig, Workload


@dataclass
class RunControls:
    """How the caller follows and steers one run: ``progress(done, total)`` as timed steps finish; ``cancel`` kills
    the run at once (its measurement ends ``error`` / ``Cancelled``); ``on_step`` sees rank 0's timed step times and
    may stop the run early (True). ``profiler_overhead`` and ``extra`` are the built-in trainer's (see
    :func:`tuner.measure.run.run_measurement`)."""

    progress: Any = None
    cancel: threading.Event | None = None
    on_step: StepHook | None = None
    profiler_overhead: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class MeasuringBackend(Protocol):
    """Measures one trial of a workload, its runs started by the launcher ``options.launcher`` names
    (:func:`tuner.measure.backends.launchers.launcher_for`)."""

    name: ClassVar[str]

    def measure(
        self, workload: Workload, trial: TrialConfig, options: MeasureOptions, controls: RunControls
    ) -> Measurement:
        """Run ``trial`` once and say what it measured. A request the backend cannot honour raises
        :class:`~tuner.errors.InputError` naming the field."""
        ...
