"""The study: the tuning loop (ask, estimate, prune or dispatch, record, tell; resumable), samplers, the memory
safety margin learned from measured runs (calibration), why a config was pruned (for people: ``pruning``), and how a
queued job becomes a study. The loop measures through :class:`Measurer`, which the real dispatcher satisfies.

May import: :mod:`tuner.measure` (its Measurement and MeasureOptions; runs go through :class:`Measurer`),
:mod:`tuner.storage`, :mod:`tuner.space`, :mod:`tuner.estimator`, :mod:`tuner.workload`, Optuna.
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
from tuner.study.pruning import PruneReason, group_reasons, memory_reason, reason_key

__all__ = [
    "GRID_PARAMETERS",
    "AskTellGridSampler",
    "Event",
    "Measurer",
    "PruneReason",
    "SlowRunStopper",
    "StudySettings",
    "TuningStudy",
    "capacity_reason",
    "group_reasons",
    "make_sampler",
    "memory_reason",
    "reason_key",
]
