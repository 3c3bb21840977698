"""The study: the tuning loop (ask, estimate, prune or dispatch, record, tell; resumable) and its samplers. The
loop measures through :class:`Measurer`, which the real dispatcher satisfies; what it predicts and learns (the
memory margin, the throughput fit, the warm start, prune reasons) comes from :mod:`tuner.forecast`.

May import: :mod:`tuner.forecast`, :mod:`tuner.measure` (its Measurement and MeasureOptions; runs go through
:class:`Measurer`), :mod:`tuner.storage`, :mod:`tuner.space`, :mod:`tuner.estimator`, :mod:`tuner.workload`, Optuna.
"""

from tuner.study.early_stop import SlowRunStopper
from tuner.study.loop import (
    GRID_PARAMETERS,
    AskTellGridSampler,
    Event,
    StudySettings,
    TuningStudy,
    capacity_reason,
    make_sampler,
)
from tuner.study.measurer import Measurer

__all__ = [
    "GRID_PARAMETERS",
    "AskTellGridSampler",
    "Event",
    "Measurer",
    "SlowRunStopper",
    "StudySettings",
    "TuningStudy",
    "capacity_reason",
    "make_sampler",
]
