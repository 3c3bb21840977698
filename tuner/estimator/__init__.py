"""Analytic memory estimator for DeepSpeed training (pure Python: no torch import).

Example:
    >>> from tuner.estimator import estimate
    >>> from tuner.workload import ClusterSpec, Workload, model_from_param_count
    >>> est = estimate(Workload(model_from_param_count(7.5e9), ClusterSpec(gpus_per_node=8, nodes=8)),
    ...                {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
    ...                 "zero_optimization": {"stage": 3}})
    >>> round(est.phases["backward"].gpu["parameters"] / 1e9, 3)
    0.234
"""

from tuner.estimator.core import estimate
from tuner.estimator.memory_estimate import MemoryEstimate
from tuner.estimator.overhead import DEFAULT_OVERHEAD, Overhead
from tuner.estimator.phases import CATEGORIES, PHASES, Phase
from tuner.estimator.settings import ConfigError, Settings, resolve

__all__ = [
    "CATEGORIES",
    "DEFAULT_OVERHEAD",
    "PHASES",
    "ConfigError",
    "MemoryEstimate",
    "Overhead",
    "Phase",
    "Settings",
    "estimate",
    "resolve",
]
