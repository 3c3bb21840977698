"""The choices a categorical parameter offers a study's trials: the layout degrees the workload can run (Ulysses,
AutoTP, AutoEP, hpZ groups) and, with a fixed global batch, the micro-batches that divide every data-parallel rank's
share of it.

Optuna needs one set of choices per parameter for the whole study, so the micro-batches are those dividing the share
of the study's data-parallel ranks: the world over the sequence- and tensor-parallel degrees the study pins, or the
whole world when it searches them (a micro-batch dividing global / world also divides global / dp for every dp that
divides the world).

Example:
    >>> micro_choices([1, 2, 4, 8], global_batch=8, data_parallel=1), micro_choices([1, 2, 4, 8], 8, 2)
    ([1, 2, 4, 8], [1, 2, 4])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.space.parameters import Parameter
from tuner.workload import Ranks, Workload
from tuner.workload.layouts import AUTOTP, LAYOUTS, ULYSSES

SP_KEY, TP_KEY = ULYSSES.key, AUTOTP.key
LAYOUT_PROBLEMS = {kind.key: kind.problem for kind in LAYOUTS}  # the layouts' own checks (tuner.workload.layouts)
MODEL_PARALLEL_KEYS = (SP_KEY, TP_KEY)  # the degrees that divide the world into data-parallel ranks


def layout_choices(parameter: Parameter, choices: Sequence[Any], workload: Workload) -> list[Any]:
    """The degrees of a layout parameter the workload can run (all ``choices`` for any other parameter)."""
    if problem := LAYOUT_PROBLEMS.get(parameter.key or ""):
        return [c for c in choices if problem(workload, c) is None]
    return list(choices)


def micro_choices(choices: Sequence[Any], global_batch: int, data_parallel: int) -> list[Any]:
    """The micro-batches of ``choices`` dividing ``global_batch`` over ``data_parallel`` ranks."""
    return [c for c in choices if (global_batch // data_parallel) % c == 0]


def study_data_parallel(parameters: Sequence[Parameter], pins: Mapping[str, Any], world: int) -> int:
    """The data-parallel ranks every trial of a study shares: ``world`` over the pinned sequence- and
    tensor-parallel degrees (a searched degree counts as 1: the micro-batches offered then divide global / world).

    Example:
        >>> tp = Parameter("tp", "categorical", TP_KEY, None, 1, choices=(1, 2))
        >>> study_data_parallel([tp], {"tp": 2}, 4), study_data_parallel([tp], {}, 4)
        (2, 4)
    """
    pinned = [p for p in parameters if p.key in MODEL_PARALLEL_KEYS and isinstance(pins.get(p.name), int)]
    return data_parallel(world, {p.key or "": pins[p.name] for p in pinned})


def trial_data_parallel(parameters: Sequence[Parameter], values: Mapping[str, Any], world: int) -> int:
    """The data-parallel ranks of a trial's ``values`` so far: ``world`` over the sequence- and tensor-parallel
    degrees it has (suggested before the batch)."""
    laid = [p for p in parameters if p.key in MODEL_PARALLEL_KEYS and p.name in values]
    return data_parallel(world, {p.key or "": values.get(p.name) or 1 for p in laid})


def data_parallel(world: int, degrees: Mapping[str, int]) -> int:
    """The data-parallel ranks of ``world`` under the sequence- and tensor-parallel ``degrees`` (by ds_config key)
    (:attr:`tuner.workload.Ranks.data_parallel`: at least 1).

    Example:
        >>> data_parallel(8, {SP_KEY: 2, TP_KEY: 2}), data_parallel(2, {TP_KEY: 4})
        (2, 1)
    """
    return Ranks(world, sequence=degrees.get(SP_KEY, 1), tensor=degrees.get(TP_KEY, 1)).data_parallel


__all__ = [
    "LAYOUT_PROBLEMS",
    "MODEL_PARALLEL_KEYS",
    "data_parallel",
    "layout_choices",
    "micro_choices",
    "study_data_parallel",
    "trial_data_parallel",
]
