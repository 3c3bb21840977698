"""Analytic memory estimator for DeepSpeed training (pure Python: no torch import), and the throughput it predicts.

Grouped by the memory model's own categories: model states by ZeRO stage (:mod:`.states`), activations
(:mod:`.activations`), runtime buffers and overheads (:mod:`.runtime`) and throughput (:mod:`.throughput`); the
parallel layouts, one module each (:mod:`.layouts`: Ulysses and ALST, AutoTP, AutoEP, ZeRO++), with ALST's tiled
loss (:mod:`.tiled_loss`); each term returns its contribution (:mod:`.terms`) and
:func:`estimate` (:mod:`.core`) combines them. Callers use this package's names.

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
from tuner.estimator.memory_estimate import CPU_VIEWS, MemoryEstimate
from tuner.estimator.phases import CATEGORIES, PHASES, Phase
from tuner.estimator.runtime.overhead import DEFAULT_OVERHEAD, Overhead
from tuner.estimator.settings import ConfigError, Settings, resolve
from tuner.estimator.states.quantized import estimate_only_why
from tuner.estimator.throughput.flops import model_flops_per_token, peak_tflops
from tuner.estimator.throughput.prediction import (
    TERMS,
    StepTerms,
    ThroughputPrediction,
    all_params,
    predict,
    trainable_params,
)

__all__ = [
    "CATEGORIES",
    "CPU_VIEWS",
    "DEFAULT_OVERHEAD",
    "PHASES",
    "TERMS",
    "ConfigError",
    "MemoryEstimate",
    "Overhead",
    "Phase",
    "Settings",
    "StepTerms",
    "ThroughputPrediction",
    "all_params",
    "estimate",
    "estimate_only_why",
    "model_flops_per_token",
    "peak_tflops",
    "predict",
    "resolve",
    "trainable_params",
]
