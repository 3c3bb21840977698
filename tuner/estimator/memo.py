"""What an estimate derives from the workload alone, computed once per workload (:func:`per_workload`).

A study, the recommender's grid and ``--max-seq-len``'s search estimate thousands of configs of one workload; the
parameters as trained, the traced activations at a micro-batch, a tensor-parallel rank's view of the model do not
change from one config to the next. A :class:`~tuner.workload.Workload` is immutable (frozen, its parts too), so a
value computed from it and hashable arguments can be kept for as long as the workload object lives: the memo is
keyed by the object's identity (hashing a workload would hash its parameter tuples on every call) and dropped when
the object is collected. Cached values are shared: they must be immutable, or never changed by their readers.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from tuner.workload import Workload

T = TypeVar("T")
_MEMOS: dict[int, dict[Any, Any]] = {}  # id(workload) -> its memo, dropped with the workload


def memo_of(workload: Workload) -> dict[Any, Any]:
    """The memo of ``workload``: a dict that lives as long as the workload object does."""
    memo = _MEMOS.get(id(workload))
    if memo is None:
        memo = _MEMOS[id(workload)] = {}
        weakref.finalize(workload, _MEMOS.pop, id(workload), None)
    return memo


def per_workload(function: Callable[..., T]) -> Callable[..., T]:
    """``function(workload, *args, **kwargs)`` computed once per workload object and (hashable) arguments.

    Example:
        >>> from tuner.workload import Workload, model_from_param_count
        >>> calls = []
        >>> @per_workload
        ... def layers(workload, extra):
        ...     calls.append(extra)
        ...     return workload.model.num_layers + extra
        >>> work = Workload(model_from_param_count(1e9))
        >>> layers(work, 1) == layers(work, 1), calls
        (True, [1])
    """

    @functools.wraps(function)
    def cached(workload: Workload, *args: Any, **kwargs: Any) -> T:
        memo = memo_of(workload)
        key = (function, args, tuple(kwargs.items()))
        try:
            return memo[key]
        except KeyError:
            value = memo[key] = function(workload, *args, **kwargs)
            return value

    return cached


__all__ = ["memo_of", "per_workload"]
