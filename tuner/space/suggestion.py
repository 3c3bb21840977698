"""One trial's configuration (:class:`Suggestion`) and its stable hash (:func:`config_key`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.workload import TrainSpec, Workload

MICRO_KEY = "train_micro_batch_size_per_gpu"
ACCUM_KEY = "gradient_accumulation_steps"
GLOBAL_KEY = "train_batch_size"
BATCH_KEYS = (MICRO_KEY, ACCUM_KEY)


@dataclass(frozen=True)
class Suggestion:
    """One trial's configuration.

    Attributes:
        ds_config: A complete DeepSpeed config: batch sizes (``train_batch_size`` included), the precision section,
            ``zero_optimization``, the base sections (optimizer, ...).
        activation_checkpointing: Whether the model recomputes activations (a training setting, not a ds_config
            key): pass it on with :meth:`apply_to`.
        params: What Optuna suggested, by parameter name (equal to ``trial.params``).
        fixed: The values that were not suggested but are in effect: pins, derived accumulation, and defaults of a
            :meth:`SearchSpace.restricted` space.
    """

    ds_config: dict[str, Any]
    activation_checkpointing: bool
    params: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """:func:`config_key` of this suggestion."""
        return config_key(self)

    def train_spec(self, train: TrainSpec) -> TrainSpec:
        """``train`` with this suggestion's micro-batch, accumulation and activation checkpointing."""
        return replace(
            train,
            micro_batch=self.ds_config[MICRO_KEY],
            grad_accum=self.ds_config[ACCUM_KEY],
            activation_checkpointing=self.activation_checkpointing,
        )

    def apply_to(self, workload: Workload) -> Workload:
        """``workload`` with its training settings updated by :meth:`train_spec` (for the estimator and runner)."""
        return replace(workload, train=self.train_spec(workload.train))


def config_key(suggestion: Suggestion | Mapping[str, Any], activation_checkpointing: bool = False) -> str:
    """A stable hash of a config: the ds_config plus activation checkpointing.

    Two trials with equal keys train identically, so the study runs one and reuses its result.

    Args:
        suggestion: A :class:`Suggestion`, or a bare ds_config dict.
        activation_checkpointing: Used with a bare ds_config only.

    Returns:
        16 hex digits.

    Example:
        >>> config_key({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}) == config_key(
        ...     {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
        True
    """
    if isinstance(suggestion, Suggestion):
        config, checkpointing = suggestion.ds_config, suggestion.activation_checkpointing
    else:
        config, checkpointing = dict(suggestion), activation_checkpointing
    payload = {"activation_checkpointing": bool(checkpointing), "ds_config": config}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
