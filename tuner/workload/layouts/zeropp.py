"""ZeRO++ hpZ as a layout: the degree is the hpZ group, ``zero_optimization.zero_hpz_partition_size`` (ZeRO-3 only);
the rules are :mod:`tuner.workload.layout_checks`'. qwZ and qgZ are ZeRO-3 switches, not degrees: the space offers
them as its own parameters."""

from __future__ import annotations

from typing import Any

from tuner.workload.config_values import ConfigError
from tuner.workload.layout_checks import HPZ_KEY, HPZ_WITH_TP, hpz_problem
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig


class HpZ(LayoutKind):
    field = "hpz_partition_size"
    key = HPZ_KEY
    label = "hpZ"
    flag = "--hpz"
    help = "ZeRO++ hpZ group size (zero_hpz_partition_size; ZeRO-3 across nodes)."
    noun = "ZeRO++ hpZ group"
    description = "ZeRO++ hpZ group size (zero_optimization.zero_hpz_partition_size)."
    maximum = 2**16

    def config(self, degree: int) -> dict[str, Any]:
        return {"zero_optimization": {"zero_hpz_partition_size": degree}} if degree > 1 else {}

    def problem(self, workload: Workload, degree: int) -> str | None:
        """hpZ groups within a node (its all-gathers stay on the node's links), at ZeRO-3 on the workload's ranks."""
        cluster = workload.cluster
        if cluster.gpus_per_node % degree:
            return f"an hpZ group of {degree} must divide the {cluster.gpus_per_node} GPUs of a node"
        return hpz_problem(3, degree, cluster.world_size)

    def check(self, workload: Workload, trial: TrialConfig) -> None:
        """The group against the stage and the ranks, and hpZ with AutoTP (refused)."""
        layout = trial.layout
        problem = hpz_problem(trial.zero.stage, layout.hpz_partition_size, workload.cluster.world_size)
        if problem:
            raise ConfigError(HPZ_KEY, problem)
        if layout.tensor_parallel > 1 and layout.hpz_partition_size > 1:
            raise ConfigError(HPZ_KEY, HPZ_WITH_TP)


HPZ = HpZ()

__all__ = ["HPZ", "HpZ"]
