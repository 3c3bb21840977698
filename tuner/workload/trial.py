"""What the search decides for one trial: :class:`TrialConfig`, the ds_config plus activation checkpointing.

What is trained (model, cluster, sequence length, precision, attention, optimizer, trainable part) is the
:class:`tuner.workload.Workload`; how it is trained is a :class:`TrialConfig`. Micro-batch and gradient accumulation
live in the ds_config (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``) and nowhere else; the
estimator resolves them once, with the rest of the config, into its settings (:func:`tuner.estimator.resolve`).
The estimator, the warm start, the study, the runner, the recommender, the exports, the API and the dashboard all
read this one object. Pure Python.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MICRO_KEY = "train_micro_batch_size_per_gpu"
ACCUM_KEY = "gradient_accumulation_steps"
GLOBAL_KEY = "train_batch_size"
BATCH_KEYS = (MICRO_KEY, ACCUM_KEY)


@dataclass(frozen=True)
class TrialConfig:
    """One trial's configuration: the complete DeepSpeed config and whether the model recomputes activations.

    Attributes:
        ds_config: The DeepSpeed config: batch sizes, the precision section, ``zero_optimization``, the optimizer...
        activation_checkpointing: Whether the model's layers are checkpointed (a setting of the model, not a
            ds_config key: transformers' ``gradient_checkpointing``).

    Example:
        >>> trial = TrialConfig({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, True)
        >>> trial.batch, trial.key == TrialConfig(dict(trial.ds_config), True).key
        ((2, 4), True)
    """

    ds_config: dict[str, Any] = field(default_factory=dict)
    activation_checkpointing: bool = False

    @property
    def key(self) -> str:
        """:func:`config_key` of this config."""
        return config_key(self)

    @property
    def batch(self) -> tuple[int | None, int | None]:
        """(micro-batch, accumulation steps) as the ds_config gives them (None where it leaves one to DeepSpeed's
        rules: the estimator's settings hold the resolved values)."""
        return self.ds_config.get(MICRO_KEY), self.ds_config.get(ACCUM_KEY)

    @classmethod
    def of(cls, trial: TrialConfig | Mapping[str, Any]) -> TrialConfig:
        """``trial`` itself, or a bare ds_config as a trial without activation checkpointing."""
        return trial if isinstance(trial, TrialConfig) else cls(dict(trial))


def config_key(trial: TrialConfig | Mapping[str, Any], activation_checkpointing: bool = False) -> str:
    """A stable hash of a config: the ds_config plus activation checkpointing.

    Two trials with equal keys train identically, so the study runs one and reuses its result.

    Args:
        trial: A :class:`TrialConfig`, or a bare ds_config dict.
        activation_checkpointing: Used with a bare ds_config only.

    Returns:
        16 hex digits.

    Example:
        >>> config_key({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}) == config_key(
        ...     {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
        True
    """
    if isinstance(trial, TrialConfig):
        config, checkpointing = trial.ds_config, trial.activation_checkpointing
    else:
        config, checkpointing = dict(trial), activation_checkpointing
    payload = {"activation_checkpointing": bool(checkpointing), "ds_config": config}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["ACCUM_KEY", "BATCH_KEYS", "GLOBAL_KEY", "MICRO_KEY", "TrialConfig", "config_key"]
