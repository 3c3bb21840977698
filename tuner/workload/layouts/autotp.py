"""AutoTP tensor parallelism as a layout: the degree is ``tensor_parallel.autotp_size``; the rules are
:mod:`tuner.workload.layout_checks`'."""

from __future__ import annotations

from typing import Any

from tuner.workload.config_values import ConfigError
from tuner.workload.layout_checks import (
    AUTOTP_ZERO3_SINCE,
    TP_KEY,
    TP_WITH_EP,
    TP_WITH_SP,
    tensor_parallel_problem,
    version_tuple,
)
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig


class AutoTP(LayoutKind):
    field = "tensor_parallel"
    key = TP_KEY
    label = "TP"
    flag = "--tensor-parallel"
    help = "AutoTP degree (tensor_parallel.autotp_size)."
    noun = "AutoTP degree"
    description = "AutoTP degree (ds_config tensor_parallel.autotp_size)."
    maximum = 2**10

    def config(self, degree: int) -> dict[str, Any]:
        return {"tensor_parallel": {"autotp_size": degree}} if degree > 1 else {}

    def problem(self, workload: Workload, degree: int) -> str | None:
        return tensor_parallel_problem(workload, degree)

    def check(self, workload: Workload, trial: TrialConfig) -> None:
        """The degree against the workload, and AutoTP with Ulysses or AutoEP (refused)."""
        layout = trial.layout
        tp = layout.tensor_parallel
        problem = tensor_parallel_problem(workload, tp)
        if problem:
            raise ConfigError(TP_KEY, problem)
        if tp > 1 and layout.sequence_parallel > 1:
            raise ConfigError(TP_KEY, TP_WITH_SP)
        if tp > 1 and layout.expert_parallel > 1:
            raise ConfigError(TP_KEY, TP_WITH_EP)


def autotp_zero3_problem(trial: TrialConfig, deepspeed_version: str) -> str | None:
    """Why ``trial`` (AutoTP with ZeRO-3) cannot train on DeepSpeed ``deepspeed_version``, or None.

    >>> trial = TrialConfig({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 3}})
    >>> autotp_zero3_problem(trial, "0.19.8") is None, autotp_zero3_problem(trial, "0.19.3")
    (True, 'AutoTP with ZeRO-3 needs DeepSpeed >= 0.19.4, this is 0.19.3')
    """
    if trial.layout.tensor_parallel <= 1 or trial.stage != 3:
        return None
    if version_tuple(deepspeed_version) >= AUTOTP_ZERO3_SINCE:
        return None
    since = ".".join(map(str, AUTOTP_ZERO3_SINCE))
    return f"AutoTP with ZeRO-3 needs DeepSpeed >= {since}, this is {deepspeed_version}"


AUTOTP = AutoTP()

__all__ = ["AUTOTP", "AutoTP", "autotp_zero3_problem"]
