"""AutoEP expert parallelism as a layout: the degree is ``expert_parallel.autoep_size`` (with ``enabled``); the checks
are :mod:`tuner.workload.expert_checks`."""

from __future__ import annotations

from typing import Any

from tuner.workload.expert_checks import EP_KEY, expert_parallel_problem
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.spec import Workload


class AutoEP(LayoutKind):
    field = "expert_parallel"
    key = EP_KEY
    label = "EP"
    flag = "--expert-parallel"
    help = "AutoEP degree (expert_parallel.autoep_size; MoE models: divides the experts)."
    noun = "AutoEP degree"
    description = "AutoEP degree (ds_config expert_parallel.autoep_size, enabled); MoE models only."
    maximum = 2**16

    def config(self, degree: int) -> dict[str, Any]:
        return {"expert_parallel": {"enabled": True, "autoep_size": degree}} if degree > 1 else {}

    def problem(self, workload: Workload, degree: int) -> str | None:
        return expert_parallel_problem(workload, degree)


AUTOEP = AutoEP()

__all__ = ["AUTOEP", "AutoEP"]
