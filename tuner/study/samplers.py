"""The sampler registry: TPE (multivariate), random, a grid over stage × micro-batch (the DeepSpeed-autotuner-like
baseline), or GP, each an Optuna sampler that works under ask-and-tell."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.requests import SAMPLERS
from tuner.space import SearchSpace
from tuner.study.settings import StudySettings

GRID_PARAMETERS = ("stage", "micro_batch")  # the DeepSpeed-autotuner-like baseline sweep


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` when the grid is exhausted.

    ``Study.stop`` only works inside ``study.optimize``; under ask-and-tell it raises from ``tell``. The loop stops on
    its own budget, and grid points proposed again are identical configs, told their recorded outcome.
    """

    def after_trial(self, study: Any, trial: Any, state: TrialState, values: Any) -> None:
        """Nothing to do: see the class docstring."""


def make_sampler(name: str, space: SearchSpace, settings: StudySettings) -> optuna.samplers.BaseSampler:
    """An Optuna sampler by name: TPE (multivariate), random, grid over stage × micro-batch, or GP."""
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, seed=settings.seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=settings.seed)
    if name == "grid":
        grid = space.grid(
            list(GRID_PARAMETERS),
            global_batch=settings.global_batch,
            world_size=settings.workload.cluster.world_size,
            nvme_path=settings.nvme_path,
        )
        return AskTellGridSampler(grid, seed=settings.seed)
    raise ValueError(f"sampler: must be one of {', '.join(SAMPLERS)}, got {name!r}")
