"""A plausible model size in a request: :data:`MAX_PARAMS`, and :func:`check_counted_params` for the families
dstune counts by arithmetic (no model built). Pure: :mod:`tuner.workload` only."""

from __future__ import annotations

from typing import Any

from tuner.workload import SUPPORTED_FAMILIES, WorkloadError, model_from_hf_config

MAX_PARAMS = 10**15


def check_counted_params(config: dict[str, Any]) -> None:
    """For the families dstune's built-in models count (arithmetic, no torch), refuse an implausible parameter count
    before the transformers model is described in the profiling service. Other families rely on the dimension
    limits alone; configs the built-in count rejects are left to transformers' own judgement."""
    if config.get("model_type") not in SUPPORTED_FAMILIES:
        return
    try:
        counted = model_from_hf_config(config).n_params
    except (WorkloadError, TypeError, ValueError, ArithmeticError):
        return
    if counted > MAX_PARAMS:
        raise WorkloadError("model", f"implausible parameter count: about {counted:.3g}, at most {MAX_PARAMS:.0e}")
