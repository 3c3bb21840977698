"""Ulysses sequence parallelism (with ALST's pieces, :mod:`tuner.workload.long_context`) as a layout: the degree is
the top-level ``sequence_parallel_size``; the checks are :mod:`tuner.workload.long_context_checks`."""

from __future__ import annotations

from typing import Any

from tuner.workload.layouts.base import LayoutKind
from tuner.workload.long_context import long_context_config
from tuner.workload.long_context_checks import SP_KEY, sequence_parallel_problem
from tuner.workload.spec import Workload


class Ulysses(LayoutKind):
    field = "sequence_parallel"
    key = SP_KEY
    label = "SP"
    flag = "--sequence-parallel"
    help = "Ulysses sequence-parallel degree (sequence_parallel_size)."
    noun = "Ulysses degree"
    description = "Ulysses degree (ds_config sequence_parallel_size)."
    maximum = 2**16
    trainer_applied = True
    memory_saver = True

    def config(self, degree: int) -> dict[str, Any]:
        return long_context_config(degree)

    def problem(self, workload: Workload, degree: int) -> str | None:
        return sequence_parallel_problem(workload, degree)


ULYSSES = Ulysses()

__all__ = ["ULYSSES", "Ulysses"]
