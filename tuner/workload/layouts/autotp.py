"""AutoTP tensor parallelism as a layout: the degree is ``tensor_parallel.autotp_size``; the checks are
:mod:`tuner.workload.layout_checks`."""

from __future__ import annotations

from typing import Any

from tuner.workload.layout_checks import TP_KEY, tensor_parallel_problem
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.spec import Workload


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


AUTOTP = AutoTP()

__all__ = ["AUTOTP", "AutoTP"]
