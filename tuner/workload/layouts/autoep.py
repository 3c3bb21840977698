"""AutoEP expert parallelism as a layout: the degree is ``expert_parallel.autoep_size`` (with ``enabled``); the rules
are :mod:`tuner.workload.expert_checks`'."""

from __future__ import annotations

from typing import Any

from tuner.workload.config_values import ConfigError, section
from tuner.workload.expert_checks import EP_KEY, expert_parallel_problem
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig


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

    def check(self, workload: Workload, trial: TrialConfig) -> None:
        check_expert_parallel(workload, trial)


def check_expert_parallel(workload: Workload, trial: TrialConfig) -> None:
    """Refuse an AutoEP setting DeepSpeed 0.19.8 cannot run on ``workload`` (:mod:`tuner.workload.expert_checks`).

    Raises:
        ConfigError: naming the field.
    """
    expert = section(trial.ds_config, "expert_parallel")
    ep = trial.layout.expert_parallel
    if ep <= 1:
        return
    problem = expert_parallel_problem(workload, ep, bool(expert.get("moe_layer_pattern")))
    if problem:
        raise ConfigError(EP_KEY, problem)
    etp = expert.get("expert_tensor_parallel_size", 1)
    if etp != 1:
        raise ConfigError(
            "expert_parallel.expert_tensor_parallel_size", f"must be 1 (DeepSpeed 0.19.8 reserves it), got {etp!r}"
        )
    if expert.get("load_balance_coeff") is not None:
        raise ConfigError("expert_parallel.load_balance_coeff", "must be null (DeepSpeed 0.19.8's AutoEP refuses it)")
    zero = trial.zero
    if zero.stage == 3:
        for field, on in (
            ("sequence_parallel_size", trial.layout.sequence_parallel > 1),
            ("zero_optimization.zero_hpz_partition_size", trial.layout.hpz_partition_size > 1),
            ("zero_optimization.zero_quantized_gradients", zero.quantized_gradients),
        ):
            if on:
                raise ConfigError(field, f"not with AutoEP at ZeRO-3 (DeepSpeed 0.19.8 refuses it: {EP_KEY} = {ep})")


AUTOEP = AutoEP()

__all__ = ["AUTOEP", "AutoEP", "check_expert_parallel"]
