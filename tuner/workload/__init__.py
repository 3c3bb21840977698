"""What is trained and how: the first stage of the pipeline, pure Python (no torch, no transformers, no SQL).

- ``spec``: the workload (:class:`ModelSpec`, :class:`ClusterSpec`, :class:`TrainSpec`, :class:`TrainableSpec`,
  :class:`Workload`), built-in presets (``presets/``), a Hugging Face ``config.json`` read into a spec;
- ``trial``: what the search decides for one trial (:class:`TrialConfig`);
- ``model_profile``: what the profile room found out about a transformers model, as plain data (:class:`ModelProfile`);
- ``quantization``: a 4-bit bitsandbytes base (:class:`QuantSpec`).

May import: :mod:`tuner.errors`, the standard library and RE2 (user patterns, :mod:`~tuner.workload.patterns`).
Everything above imports from here.
"""

from tuner.workload.model_profile import PROFILE_FORMAT, ActivationProfile, Linear, ModelProfile
from tuner.workload.quantization import (
    BLOCKSIZE,
    DTYPE_BYTES,
    MEASURED_QUANTIZATION,
    NEEDS_CUDA,
    NESTED_BLOCKSIZE,
    QuantSpec,
)
from tuner.workload.spec import (
    MAX_FREEZE_PATTERN,
    SUPPORTED_FAMILIES,
    ClusterSpec,
    ModelSpec,
    TrainableSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    check_config_limits,
    load_builtin_model,
    load_hf_config,
    model_from_hf_config,
    model_from_param_count,
    preset_config,
    preset_names,
    read_json_object,
    workload_from_dict,
    workload_to_dict,
)
from tuner.workload.trial import ACCUM_KEY, BATCH_KEYS, GLOBAL_KEY, MICRO_KEY, TrialConfig, config_key

__all__ = [
    "ACCUM_KEY",
    "BATCH_KEYS",
    "BLOCKSIZE",
    "DTYPE_BYTES",
    "GLOBAL_KEY",
    "MAX_FREEZE_PATTERN",
    "MEASURED_QUANTIZATION",
    "MICRO_KEY",
    "NEEDS_CUDA",
    "NESTED_BLOCKSIZE",
    "PROFILE_FORMAT",
    "SUPPORTED_FAMILIES",
    "ActivationProfile",
    "ClusterSpec",
    "Linear",
    "ModelProfile",
    "ModelSpec",
    "QuantSpec",
    "TrainSpec",
    "TrainableSpec",
    "TrialConfig",
    "Workload",
    "WorkloadError",
    "check_config_limits",
    "config_key",
    "load_builtin_model",
    "load_hf_config",
    "model_from_hf_config",
    "model_from_param_count",
    "preset_config",
    "preset_names",
    "read_json_object",
    "workload_from_dict",
    "workload_to_dict",
]
