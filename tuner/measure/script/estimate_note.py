"""The estimate beside a training command's measured peak, and what it assumes of how the command builds its model."""

from __future__ import annotations

from typing import Any

from tuner.estimator import ConfigError, estimate
from tuner.workload import TrialConfig, Workload

ZERO_INIT = (
    "the model built partitioned under zero.Init at ZeRO-3 (HF from_pretrained/from_config does so when the "
    "ds_config is set before the model is built); a script that builds the model whole and then hands it to "
    "deepspeed.initialize holds more at its peak (the whole model on every rank while it is built)"
)
WHOLE = "the model built whole on every rank, then handed to deepspeed.initialize (ZeRO-0/1/2 keep it whole)"


def assumption(trial: TrialConfig) -> str:
    """What the estimate assumes of the model's construction under ``trial``.

    >>> assumption(TrialConfig({"zero_optimization": {"stage": 1}})).startswith("the model built whole")
    True
    """
    try:
        stage = trial.stage
    except ConfigError:
        stage = 0
    return ZERO_INIT if stage == 3 else WHOLE


def script_estimate(workload: Workload, trial: TrialConfig) -> tuple[dict[str, Any] | None, str]:
    """The estimate of ``trial`` (None where the command's config leaves what it reads to ``auto``) and what it
    assumes of the model's construction."""
    try:
        return estimate(workload, trial).to_dict(), assumption(trial)
    except (ConfigError, TypeError, ValueError) as error:
        return None, f"no estimate: {error}"
