"""The choices a categorical parameter offers a study's trials: the layout degrees the workload can run (Ulysses,
AutoTP, AutoEP, hpZ groups) and, with a fixed global batch, the micro-batches that divide every data-parallel rank's
share of it.

Optuna needs one set of choices per parameter for the whole study, so the micro-batches are those dividing the share
of the study's data-parallel ranks: the ranks of the layout the study pins (:class:`tuner.workload.Ranks` over every
kind of :data:`tuner.workload.layouts.LAYOUTS`: world / (sp × tp)), each searched degree counted as 1 (a micro-batch
dividing global / world also divides global / dp for every dp that divides the world). The space's grid (the grid
sampler's and the warm start's) offers the same micro-batches as its trials, so a config the warm start queues is one
the study offers.

Example:
    >>> micro_choices([1, 2, 4, 8], global_batch=8, data_parallel=1), micro_choices([1, 2, 4, 8], 8, 2)
    ([1, 2, 4, 8], [1, 2, 4])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.space.parameters import Parameter
from tuner.workload import ParallelLayout, Workload
from tuner.workload.layouts import BY_KEY, LAYOUTS

LAYOUT_PROBLEMS = {kind.key: kind.problem for kind in LAYOUTS}  # the layouts' own checks (tuner.workload.layouts)


def layout_choices(parameter: Parameter, choices: Sequence[Any], workload: Workload) -> list[Any]:
    """The degrees of a layout parameter the workload can run (all ``choices`` for any other parameter)."""
    if problem := LAYOUT_PROBLEMS.get(parameter.key or ""):
        return [c for c in choices if problem(workload, c) is None]
    return list(choices)


def micro_choices(choices: Sequence[Any], global_batch: int, data_parallel: int) -> list[Any]:
    """The micro-batches of ``choices`` dividing ``global_batch`` over ``data_parallel`` ranks."""
    return [c for c in choices if (global_batch // data_parallel) % c == 0]


def study_data_parallel(parameters: Sequence[Parameter], pins: Mapping[str, Any], world: int) -> int:
    """The data-parallel ranks every trial of a study shares: those of the layout degrees the study pins (a searched
    degree counts as 1: the micro-batches offered then divide global / world).

    Example:
        >>> tp = Parameter("tp", "categorical", "tensor_parallel.autotp_size", None, 1, choices=(1, 2))
        >>> study_data_parallel([tp], {"tp": 2}, 4), study_data_parallel([tp], {}, 4)
        (2, 4)
    """
    return data_parallel(world, _degrees(parameters, {name: v for name, v in pins.items() if isinstance(v, int)}))


def trial_data_parallel(parameters: Sequence[Parameter], values: Mapping[str, Any], world: int) -> int:
    """The data-parallel ranks of a trial's ``values`` so far (its layout degrees are suggested before the batch)."""
    return data_parallel(world, _degrees(parameters, values))


def data_parallel(world: int, degrees: Mapping[str, int]) -> int:
    """The data-parallel ranks of ``world`` under the layout ``degrees`` (by ds_config key), as
    :attr:`tuner.workload.Ranks.data_parallel` counts them (at least 1): sequence and tensor parallelism divide the
    world, expert parallelism and hpZ groups do not.

    Example:
        >>> data_parallel(8, {"sequence_parallel_size": 2, "tensor_parallel.autotp_size": 2})
        2
        >>> data_parallel(8, {"expert_parallel.autoep_size": 4}), data_parallel(2, {"tensor_parallel.autotp_size": 4})
        (8, 1)
    """
    layout = ParallelLayout(**{BY_KEY[key].field: degree for key, degree in degrees.items()})
    return layout.ranks(world).data_parallel


def _degrees(parameters: Sequence[Parameter], values: Mapping[str, Any]) -> dict[str, int]:
    """The layout degrees among ``values`` (by parameter name), by ds_config key (None, an inactive layout: 1)."""
    return {
        p.key: values.get(p.name) or 1 for p in parameters if p.key is not None and p.key in BY_KEY and p.name in values
    }


__all__ = [
    "LAYOUT_PROBLEMS",
    "data_parallel",
    "layout_choices",
    "micro_choices",
    "study_data_parallel",
    "trial_data_parallel",
]
