"""The study: the tuning loop (ask, estimate, prune or dispatch, record, tell; resumable), samplers, the memory
safety margin learned from measured runs (calibration), and how a queued job becomes a study.

May import: :mod:`tuner.measure` (through the dispatcher), :mod:`tuner.storage`, :mod:`tuner.space`,
:mod:`tuner.estimator`, :mod:`tuner.workload`, Optuna.
"""

from tuner.study.loop import (
    GRID_PARAMETERS,
    AskTellGridSampler,
    Event,
    StudySettings,
    TuningStudy,
    capacity_reason,
    make_sampler,
)

__all__ = [
    "GRID_PARAMETERS",
    "AskTellGridSampler",
    "Event",
    "StudySettings",
    "TuningStudy",
    "capacity_reason",
    "make_sampler",
]
