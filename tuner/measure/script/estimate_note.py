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


# the ZeRO keys the HF Trainer and accelerate fill from the model's hidden size h where they say "auto"
HIDDEN_FILLS = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


def _hidden_filled(zero: dict[str, Any], hidden: int) -> dict[str, Any]:
    if not hidden:
        return zero
    return {k: HIDDEN_FILLS[k](hidden) if v == "auto" and k in HIDDEN_FILLS else v for k, v in zero.items()}


def without_auto(config: dict[str, Any], precision: str, hidden: int = 0) -> dict[str, Any]:
    """``config`` with the HF Trainer's ``"auto"`` values as the Trainer (and accelerate) fill them: the ZeRO buckets
    from the model's ``hidden`` size (h² for ``reduce_bucket_size``), the precision sections from the workload's
    precision, the rest left to DeepSpeed's defaults.

    >>> without_auto({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}},
    ...              "bf16", hidden=64)
    {'bf16': {'enabled': True}, 'zero_optimization': {'stage': 2, 'reduce_bucket_size': 4096}}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in ("bf16", "fp16") and isinstance(value, dict) and value.get("enabled") == "auto":
            out[key] = {**without_auto(value, precision), "enabled": key == precision}
        elif key == "zero_optimization" and isinstance(value, dict):
            out[key] = without_auto(_hidden_filled(value, hidden), precision)
        elif isinstance(value, dict):
            out[key] = without_auto(value, precision)
        elif value != "auto":
            out[key] = value
    return out


def script_estimate(workload: Workload, trial: TrialConfig) -> tuple[dict[str, Any] | None, str]:
    """The estimate of ``trial`` (its ``auto`` values as :func:`without_auto` reads them; None where the config
    still cannot be estimated) and what it assumes of the model's construction; none without a model (no
    ``--model``: the command's own model is unknown)."""
    if workload.model.is_unknown:
        return None, "no estimate: no --model describes the command's model"
    config = without_auto(trial.ds_config, workload.train.precision, workload.model.hidden_size)
    readable = TrialConfig(config, trial.activation_checkpointing)
    try:
        return estimate(workload, readable).to_dict(), assumption(readable)
    except (ConfigError, TypeError, ValueError) as error:
        return None, f"no estimate: {error}"
