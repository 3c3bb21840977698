"""One trial's configuration as the space suggested it (:class:`Suggestion`): a :class:`~tuner.workload.TrialConfig`
with the parameter values that produced it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.workload import TrialConfig, config_key


@dataclass(frozen=True)
class Suggestion:
    """One trial's configuration and where it came from.

    Attributes:
        trial: What the trial trains with: a complete DeepSpeed config (batch sizes, ``train_batch_size``
            included, the precision section, ``zero_optimization``, the base sections) and activation checkpointing.
        params: What Optuna suggested, by parameter name (equal to ``trial.params``).
        fixed: The values that were not suggested but are in effect: pins, derived accumulation, and defaults of a
            :meth:`SearchSpace.restricted` space.
    """

    trial: TrialConfig
    params: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """:func:`config_key` of this suggestion's trial config."""
        return self.trial.key


__all__ = ["Suggestion", "config_key"]
