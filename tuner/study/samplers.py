"""The sampler registry: TPE (multivariate), random, a grid over stage × micro-batch (the DeepSpeed-autotuner-like
baseline), or GP, each an Optuna sampler that works under ask-and-tell."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.requests import SAMPLERS
from tuner.space import SearchSpace
from tuner.space.numerics_choices import NUMERICS_PARAMETERS
from tuner.study.settings import StudySettings

GRID_PARAMETERS = ("stage", "micro_batch")  # the DeepSpeed-autotuner-like baseline sweep


def grid_parameters(space: SearchSpace) -> tuple[str, ...]:
    """What the grid sweeps in ``space``: stage × micro-batch, and the numerics choices where the study allows them
    (``--allow-numerics-changes`` added them to the space; a space without them sweeps the baseline alone)."""
    return (*GRID_PARAMETERS, *(name for name in NUMERICS_PARAMETERS if name in space.names))


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` when the grid is exhausted.

    ``Study.stop`` only works inside ``study.optimize``; under ask-and-tell it raises from ``tell``. The loop stops on
    its own budget, and grid points proposed again are identical configs, told their recorded outcome.
    """

    def after_trial(self, study: Any, trial: Any, state: TrialState, values: Any) -> None:
        """Nothing to do: see the class docstring."""


def make_sampler(name: str, space: SearchSpace, settings: StudySettings) -> optuna.samplers.BaseSampler:
    """An Optuna sampler by name: TPE (multivariate), random, grid (:func:`grid_parameters`), or GP."""
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, seed=settings.seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=settings.seed)
    if name == "grid":
        grid = space.grid(
            list(grid_parameters(space)),
            global_batch=settings.global_batch,
            world_size=settings.workload.cluster.world_size,
            nvme_path=settings.nvme_path,
        )
        return AskTellGridSampler(grid, seed=settings.seed)
    raise ValueError(f"sampler: must be one of {', '.join(SAMPLERS)}, got {name!r}")
