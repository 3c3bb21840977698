"""What is trained and how: the first stage of the pipeline, pure Python (no torch, no transformers, no SQL).

- ``spec``: the workload (:class:`ClusterSpec`, :class:`TrainSpec`, :class:`TrainableSpec`, :class:`Workload`), its
  fingerprint and stored dict;
- ``model``: the model's shapes (:class:`ModelSpec`), or a bare parameter count;
- ``hf_config``: a Hugging Face ``config.json`` or a built-in preset (``presets/``) read into a :class:`ModelSpec`;
- ``vocabulary``: the workload's vocabularies (precision, attention, optimizer, device, model implementation), each
  declared once as a ``Literal`` type with its tuple of values;
- ``errors``: :class:`WorkloadError`;
- ``gpu_types``: the GPU types a cluster can be made of (:data:`GPU_TYPES`: usable memory, architecture, datasheet
  rates) and :func:`gpu_type_of`, a device's name to its type;
- ``launch_env``: the launch environment ranks run in (:class:`LaunchEnv`, each launcher's rules: :func:`rank_env`);
- ``trial``: what the search decides for one trial (:class:`TrialConfig`);
- ``model_profile``: what the profile room found out about a transformers model, as plain data (:class:`ModelProfile`);
- ``quantization``: a 4-bit bitsandbytes base (:class:`QuantSpec`);
- ``long_context_checks``, ``layout_checks`` and ``expert_checks``: the rules of the layouts DeepSpeed refuses
  (Ulysses and ALST; AutoTP and hpZ; AutoEP), one line naming the field;
- ``layouts``: the parallel layouts, one module each (Ulysses, AutoTP, AutoEP, ZeRO++ hpZ) with its checks of a
  trial, and their registry (:data:`tuner.workload.layouts.LAYOUTS`) the rooms above derive their layout checks, flags
  and configs from;
- ``ranks``: one description of the ranks (:class:`Ranks`): from the layout's degrees and the cluster, every
  group's size and members, the communicators and a rank's place;
- ``differences``: the settings in which a table's trials (or workloads) differ beyond its columns, in words;
- ``zero``, ``layout`` and ``config_values``: the typed views :class:`TrialConfig` reads a ds_config's sections
  through (:class:`ZeroConfig`, :class:`ParallelLayout`), the only code that parses a ds_config.

May import: :mod:`tuner.errors`, the standard library and RE2 (user patterns, :mod:`~tuner.workload.patterns`).
Everything above imports from here.
"""

from tuner.workload.config_values import ConfigError
from tuner.workload.errors import WorkloadError
from tuner.workload.expert_checks import EP_KEY, expert_parallel_problem
from tuner.workload.gpu_types import (
    GPU_TYPE_NAMES,
    GPU_TYPES,
    GpuType,
    GpuTypeName,
    bf16_problem,
    default_gpu_memory,
    gpu_type_of,
)
from tuner.workload.hf_config import (
    SUPPORTED_FAMILIES,
    check_config_limits,
    load_builtin_model,
    load_hf_config,
    model_from_hf_config,
    preset_config,
    preset_names,
    read_json_object,
)
from tuner.workload.launch_env import LaunchEnv, RankEnv, launch_command, rank_env
from tuner.workload.layout import ParallelLayout
from tuner.workload.layout_checks import AUTOTP_ZERO3_SINCE, hpz_problem, tensor_parallel_problem
from tuner.workload.layouts import autotp_zero3_problem, check_expert_parallel, check_layout, check_long_context
from tuner.workload.long_context import LongContext, long_context_config
from tuner.workload.long_context_checks import kv_replication, sequence_parallel_problem
from tuner.workload.model import UNKNOWN_FAMILY, ModelSpec, model_from_param_count, unknown_model
from tuner.workload.model_profile import PROFILE_FORMAT, ActivationProfile, Linear, ModelProfile
from tuner.workload.numerics import Numerics, numerics_config
from tuner.workload.quantization import (
    BLOCKSIZE,
    DTYPE_BYTES,
    MEASURED_QUANTIZATION,
    NEEDS_CUDA,
    NESTED_BLOCKSIZE,
    QuantSpec,
)
from tuner.workload.ranks import Communicator, RankPlace, Ranks
from tuner.workload.spec import (
    MAX_FREEZE_PATTERN,
    MAX_SEQ_LEN,
    ClusterSpec,
    TrainableSpec,
    TrainSpec,
    Workload,
    workload_from_dict,
    workload_to_dict,
)
from tuner.workload.trial import (
    ACCUM_KEY,
    BATCH_KEYS,
    DEFAULT_ACCUM,
    DEFAULT_MICRO,
    ENV_SECTION,
    GLOBAL_KEY,
    MICRO_KEY,
    BatchSizes,
    TrialConfig,
    accumulation_for,
    config_key,
    resolve_batch,
)
from tuner.workload.vocabulary import (
    ATTENTION_KINDS,
    DEVICES,
    LAUNCHER_ENVS,
    MODEL_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    Attention,
    Device,
    LauncherEnv,
    ModelImpl,
    Optimizer,
    Precision,
)
from tuner.workload.zero import (
    OFFLOAD_DEVICES,
    OFFLOAD_OPTIMIZER_KEYS,
    OFFLOAD_PARAM_KEYS,
    ZERO_KEYS,
    Offload,
    ZeroConfig,
)

__all__ = [
    "ACCUM_KEY",
    "ATTENTION_KINDS",
    "AUTOTP_ZERO3_SINCE",
    "BATCH_KEYS",
    "BLOCKSIZE",
    "DEFAULT_ACCUM",
    "DEFAULT_MICRO",
    "DEVICES",
    "DTYPE_BYTES",
    "ENV_SECTION",
    "EP_KEY",
    "GLOBAL_KEY",
    "GPU_TYPES",
    "GPU_TYPE_NAMES",
    "LAUNCHER_ENVS",
    "MAX_FREEZE_PATTERN",
    "MAX_SEQ_LEN",
    "MEASURED_QUANTIZATION",
    "MICRO_KEY",
    "MODEL_IMPLS",
    "NEEDS_CUDA",
    "NESTED_BLOCKSIZE",
    "OFFLOAD_DEVICES",
    "OFFLOAD_OPTIMIZER_KEYS",
    "OFFLOAD_PARAM_KEYS",
    "OPTIMIZERS",
    "PRECISIONS",
    "PROFILE_FORMAT",
    "SUPPORTED_FAMILIES",
    "UNKNOWN_FAMILY",
    "ZERO_KEYS",
    "ActivationProfile",
    "Attention",
    "BatchSizes",
    "ClusterSpec",
    "Communicator",
    "ConfigError",
    "Device",
    "GpuType",
    "GpuTypeName",
    "LaunchEnv",
    "LauncherEnv",
    "Linear",
    "LongContext",
    "ModelImpl",
    "ModelProfile",
    "ModelSpec",
    "Numerics",
    "Offload",
    "Optimizer",
    "ParallelLayout",
    "Precision",
    "QuantSpec",
    "RankEnv",
    "RankPlace",
    "Ranks",
    "TrainSpec",
    "TrainableSpec",
    "TrialConfig",
    "Workload",
    "WorkloadError",
    "ZeroConfig",
    "accumulation_for",
    "autotp_zero3_problem",
    "bf16_problem",
    "check_config_limits",
    "check_expert_parallel",
    "check_layout",
    "check_long_context",
    "config_key",
    "default_gpu_memory",
    "expert_parallel_problem",
    "gpu_type_of",
    "hpz_problem",
    "kv_replication",
    "launch_command",
    "load_builtin_model",
    "load_hf_config",
    "long_context_config",
    "model_from_hf_config",
    "model_from_param_count",
    "numerics_config",
    "preset_config",
    "preset_names",
    "rank_env",
    "read_json_object",
    "resolve_batch",
    "sequence_parallel_problem",
    "tensor_parallel_problem",
    "unknown_model",
    "workload_from_dict",
    "workload_to_dict",
]
