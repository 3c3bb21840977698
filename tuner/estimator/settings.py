"""Read the settings that decide memory out of a DeepSpeed config dict, with DeepSpeed 0.19's defaults.

Pure Python and fast (the tuner resolves tens of thousands of configs). Unknown ``zero_optimization`` keys and bad
values are rejected the way DeepSpeed's own pydantic models reject them, with the offending key named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import InputError
from tuner.workload import TrialConfig, Workload

FP32 = 4  # bytes per fp32 element: masters, Adam moments, upcasts

# Field names and aliases of DeepSpeedZeroConfig and its offload configs in DeepSpeed 0.19.
ZERO_KEYS = frozenset(
    [
        "allgather_bucket_size",
        "allgather_partitions",
        "allgather_sequential",
        "compute_grad_norm",
        "contiguous_gradients",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "gather_16bit_weights_on_model_save",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "max_live_parameters",
        "max_reuse_distance",
        "memory_efficient_linear",
        "model_persistence_threshold",
        "module_granularity_threshold",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "param_persistence_threshold",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "prefetch_bucket_size",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size",
        "use_all_reduce_for_fetch_params",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
    ]
)
OFFLOAD_PARAM_KEYS = frozenset({"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"})
OFFLOAD_OPTIMIZER_KEYS = frozenset(
    {
        "buffer_count",
        "cpuadam_cores_perc",
        "device",
        "fast_init",
        "nvme_path",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "ratio",
        "super_offload",
    }
)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
GATHER_ON_SAVE_KEYS = (
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
)
ADAM_FAMILY = frozenset({"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "onebitadam", "zerooneadam"})


class ConfigError(InputError):
    """A ds_config value the estimator (and DeepSpeed) cannot accept; ``field`` is its dotted key."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the estimator needs from workload + trial config, resolved and validated: the one place a trial's
    micro-batch, accumulation and activation checkpointing are read."""

    world_size: int
    micro_batch: int
    grad_accum: int
    precision: str
    stage: int
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_bucket_size: int
    allgather_bucket_size: int
    offload_optimizer: str
    offload_optimizer_pin: bool
    offload_optimizer_buffer_count: int
    offload_param: str
    offload_param_pin: bool
    offload_param_buffer_count: int
    offload_param_buffer_size: int
    max_live_parameters: int
    max_reuse_distance: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    model_persistence_threshold: int
    sub_group_size: int
    round_robin_gradients: bool = False
    memory_efficient_linear: bool = True
    gather_16bit_on_save: bool = False
    hpz_partition_size: int = 1
    sequence_parallel_size: int = 1
    expert_parallel_size: int = 1
    quantized_gradients: bool = False
    quantized_nontrainable: bool = False  # zero_quantized_nontrainable_weights (ZeRO-3 only, CUDA only)
    expandable_segments: bool = False
    optimizer_impl: str = "fused"  # which Adam DeepSpeed builds (:func:`optimizer_impl`)
    reduce_scatter: bool = True
    multi_rank_bucket_allreduce: bool = True
    activation_checkpointing: bool = False

    @property
    def param_bytes(self) -> int:
        """Bytes per element of the parameters DeepSpeed trains (16-bit or fp32)."""
        return FP32 if self.precision == "fp32" else 2


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be an object, got {type(value).__name__}")
    return value


def _int(section: dict[str, Any], key: str, default: int, prefix: str, minimum: int = 0) -> int:
    value = section.get(key, default)
    if type(value) is int and value >= minimum:  # the common case, checked first: the tuner resolves many configs
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{prefix}{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{prefix}{key}", f"must be >= {minimum}, got {value}")
    return value


def _bool(section: dict[str, Any], key: str, default: bool, prefix: str) -> bool:
    value = section.get(key, default)
    if value is not True and value is not False:
        raise ConfigError(f"{prefix}{key}", f"must be true or false, got {value!r}")
    return value


def _enabled(config: dict[str, Any], key: str) -> bool:
    section = _section(config, key)
    return _bool(section, "enabled", False, f"{key}.") if section else False


def _offload(zero: dict[str, Any], key: str, allowed: frozenset[str]) -> dict[str, Any]:
    section = _section(zero, key)
    prefix = f"zero_optimization.{key}."
    for name in section.keys() - allowed:
        raise ConfigError(f"{prefix}{name}", "unknown key (DeepSpeed rejects it)")
    device = section.get("device", "none")
    if device is None:
        device = "none"
    if device not in OFFLOAD_DEVICES:
        raise ConfigError(f"{prefix}device", f"must be one of none, cpu, nvme, got {device!r}")
    if device == "nvme" and not section.get("nvme_path"):
        raise ConfigError(f"{prefix}nvme_path", "required when device is nvme")
    return section


def _zero_value(zero: dict[str, Any], names: tuple[str, str], default: int) -> int:
    """A stage-3 key given under its ``stage3_`` alias or its plain field name."""
    key = names[0] if names[0] in zero else names[1]
    return _int(zero, key, default, "zero_optimization.")


def resolve(workload: Workload, trial: TrialConfig | Mapping[str, Any]) -> Settings:
    """Resolve the memory-relevant settings of a trial config (or a bare ds_config: no checkpointing) for
    ``workload``.

    Batch sizes follow DeepSpeed's rules: ``train_batch_size = micro_batch × grad_accum × world_size``, any two
    determine the third; a micro-batch or accumulation the config leaves open is 1.

    Raises:
        ConfigError: a malformed or unsupported value, naming its key.
    """
    if not isinstance(trial, (TrialConfig, Mapping)):
        raise ConfigError("ds_config", "must be a JSON object")
    trial = TrialConfig.of(trial)
    ds_config = trial.ds_config
    if not isinstance(ds_config, dict):
        raise ConfigError("ds_config", "must be a JSON object")
    world = workload.cluster.world_size
    micro, accum, _ = _batch_sizes(ds_config, world)
    fp16, bf16 = _enabled(ds_config, "fp16"), _enabled(ds_config, "bf16")
    if fp16 and bf16:
        raise ConfigError("bf16.enabled", "fp16 and bf16 cannot both be enabled")
    precision = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    _check_optimizer(ds_config)
    grad_accum_dtype = _section(ds_config, "data_types").get("grad_accum_dtype")
    if grad_accum_dtype not in (None, "fp16" if fp16 else "bf16" if bf16 else "fp32"):
        raise ConfigError(
            "data_types.grad_accum_dtype",
            "a gradient accumulation dtype other than the model's is not modelled by the estimator yet",
        )

    zero = _section(ds_config, "zero_optimization")
    for name in sorted(zero.keys() - ZERO_KEYS):
        raise ConfigError(f"zero_optimization.{name}", "unknown key (DeepSpeed rejects it)")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage!r}")
    prefix = "zero_optimization."
    overlap_default = stage == 3
    overlap = zero.get("overlap_comm")
    overlap_comm = overlap_default if overlap is None else _bool(zero, "overlap_comm", overlap_default, prefix)
    opt_offload = _offload(zero, "offload_optimizer", OFFLOAD_OPTIMIZER_KEYS)
    param_offload = _offload(zero, "offload_param", OFFLOAD_PARAM_KEYS)
    opt_device = opt_offload.get("device") or "none"
    param_device = param_offload.get("device") or "none"
    if opt_device != "none" and stage == 0:
        raise ConfigError(f"{prefix}offload_optimizer.device", "optimizer offload needs ZeRO stage 1, 2 or 3")
    if param_device != "none" and stage != 3:
        raise ConfigError(f"{prefix}offload_param.device", f"parameter offload needs ZeRO stage 3, got stage {stage}")
    if opt_device == "nvme" and stage != 3:
        raise ConfigError(f"{prefix}offload_optimizer.device", "NVMe optimizer offload needs ZeRO stage 3")
    allgather = _int(zero, "allgather_bucket_size", 500_000_000, prefix)
    if stage in (1, 2) and allgather % 2:
        raise ConfigError(f"{prefix}allgather_bucket_size", "must be a multiple of 2 (DeepSpeed's NCCL alignment)")
    _check_trainable_dtypes(stage, precision, workload)
    settings = Settings(
        world_size=world,
        micro_batch=micro,
        grad_accum=accum,
        precision=precision,
        stage=stage,
        overlap_comm=overlap_comm,
        contiguous_gradients=_bool(zero, "contiguous_gradients", True, prefix),
        reduce_bucket_size=_int(zero, "reduce_bucket_size", 500_000_000, prefix, minimum=1),
        allgather_bucket_size=allgather,
        offload_optimizer=opt_device,
        offload_optimizer_pin=_bool(opt_offload, "pin_memory", True, f"{prefix}offload_optimizer."),
        offload_optimizer_buffer_count=_int(opt_offload, "buffer_count", 4, f"{prefix}offload_optimizer."),
        offload_param=param_device,
        offload_param_pin=_bool(param_offload, "pin_memory", True, f"{prefix}offload_param."),
        offload_param_buffer_count=_int(param_offload, "buffer_count", 5, f"{prefix}offload_param."),
        offload_param_buffer_size=_int(param_offload, "buffer_size", 100_000_000, f"{prefix}offload_param."),
        max_live_parameters=_zero_value(zero, ("stage3_max_live_parameters", "max_live_parameters"), 1_000_000_000),
        max_reuse_distance=_zero_value(zero, ("stage3_max_reuse_distance", "max_reuse_distance"), 1_000_000_000),
        prefetch_bucket_size=_zero_value(zero, ("stage3_prefetch_bucket_size", "prefetch_bucket_size"), 50_000_000),
        param_persistence_threshold=_zero_value(
            zero, ("stage3_param_persistence_threshold", "param_persistence_threshold"), 100_000
        ),
        model_persistence_threshold=_zero_value(
            zero, ("stage3_model_persistence_threshold", "model_persistence_threshold"), 2**63 - 1
        ),
        sub_group_size=_int(zero, "sub_group_size", 1_000_000_000, prefix),
        round_robin_gradients=_bool(zero, "round_robin_gradients", False, prefix),
        memory_efficient_linear=_bool(zero, "memory_efficient_linear", True, prefix),
        gather_16bit_on_save=_gather_on_save(zero),
        hpz_partition_size=max(1, _int(zero, "zero_hpz_partition_size", 1, prefix)),  # DeepSpeed: ge=0
        sequence_parallel_size=_int(ds_config, "sequence_parallel_size", 1, "", minimum=1),
        expert_parallel_size=_expert_parallel_size(ds_config),
        quantized_gradients=_bool(zero, "zero_quantized_gradients", False, prefix),
        quantized_nontrainable=_quantized_nontrainable(zero, stage, workload),
        expandable_segments=expandable_segments(ds_config),
        optimizer_impl=optimizer_impl(ds_config, workload.cluster.device, opt_device != "none"),
        reduce_scatter=_bool(zero, "reduce_scatter", True, prefix),
        multi_rank_bucket_allreduce=_bool(zero, "use_multi_rank_bucket_allreduce", True, prefix),
        activation_checkpointing=bool(trial.activation_checkpointing),
    )
    return settings


ENV_SECTION = "dstune"  # a top-level ds_config section DeepSpeed ignores: settings dstune applies to the run itself


def expandable_segments(ds_config: dict[str, Any]) -> bool:
    """Whether the run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``dstune.expandable_segments``, a
    search-space parameter; the runner applies it to CUDA runs and takes the section out before DeepSpeed)."""
    return _bool(_section(ds_config, ENV_SECTION), "expandable_segments", False, f"{ENV_SECTION}.")


def _expert_parallel_size(ds_config: dict[str, Any]) -> int:
    """AutoEP's ``expert_parallel.autoep_size`` when ``expert_parallel.enabled`` (DeepSpeed 0.19.8), else 1."""
    section = _section(ds_config, "expert_parallel")
    if not _bool(section, "enabled", False, "expert_parallel."):
        return 1
    return _int(section, "autoep_size", 1, "expert_parallel.", minimum=1)


OPTIMIZER_IMPLS = ("fused", "cpu_adam", "torch_single", "torch_foreach", "torch_fused")


def optimizer_impl(config: dict[str, Any], device: str, offload: bool) -> str:
    """The Adam implementation DeepSpeed 0.19 builds (``engine.get_optimizer_configuration``) on ``device``.

    ``torch_adam: true`` gives ``torch.optim.AdamW``: ``fused`` or ``foreach`` as its params say, else torch's own
    default (foreach on CUDA, the single-tensor loop on CPU, ``_default_to_fused_or_foreach``); otherwise optimizer
    offload gives ``DeepSpeedCPUAdam`` and everything else ``FusedAdam``. FusedAdam and CPU-Adam step in place; torch's
    single-tensor loop builds two temporaries the size of each parameter, foreach one list the size of them all.
    """
    params = _section(config, "optimizer").get("params") or {}
    if not isinstance(params, dict) or not params.get("torch_adam"):
        return "cpu_adam" if offload else "fused"
    if params.get("fused"):
        return "torch_fused"
    foreach = params.get("foreach")
    if foreach is None:
        foreach = device == "cuda"
    return "torch_foreach" if foreach else "torch_single"


def _quantized_nontrainable(zero: dict[str, Any], stage: int, workload: Workload) -> bool:
    """``zero_quantized_nontrainable_weights`` at ZeRO-3 (DeepSpeed ignores it at other stages); refused on CPU
    ranks: DeepSpeed's ``CUDAQuantizer`` loads a CUDA kernel (``QuantizerBuilder``)."""
    key = "zero_quantized_nontrainable_weights"
    on = _bool(zero, key, False, "zero_optimization.") and stage == 3
    if on and workload.cluster.device != "cuda":
        raise ConfigError(f"zero_optimization.{key}", "needs CUDA (DeepSpeed's CUDA quantizer): estimate only there")
    if on and workload.trainable.quantization:
        raise ConfigError(f"zero_optimization.{key}", "not with a 4-bit bitsandbytes base (already quantized)")
    return on


def _check_trainable_dtypes(stage: int, precision: str, workload: Workload) -> None:
    """Refuse ZeRO-3 over trainable parameters of more than one dtype: DeepSpeed 0.19.8's stage-3 optimizer
    flattens them into one buffer (``defragment`` asserts a single dtype). peft keeps its LoRA adapters fp32 beside
    a 16-bit base, and ``modules_to_save`` copies keep the base's dtype: measured, the ranks fail in
    ``deepspeed.initialize`` (``bench/peft_memory.py``)."""
    profile = workload.profile
    if stage != 3 or precision == "fp32" or profile is None or workload.trainable.is_full:
        return
    dtypes = {dtype for dtype, train in zip(profile.param_dtypes, profile.trainable, strict=False) if train}
    if len(dtypes) > 1:
        raise ConfigError(
            "zero_optimization.stage",
            f"ZeRO-3 needs every trainable parameter in one dtype (DeepSpeed's stage-3 optimizer asserts it); "
            f"this model as trained has {' and '.join(sorted(dtypes))} ones (peft's adapters beside "
            f"modules_to_save copies): use ZeRO 0-2, or cast the adapters to the training dtype",
        )


def _gather_on_save(zero: dict[str, Any]) -> bool:
    """``stage3_gather_16bit_weights_on_model_save`` (or its field name, or the deprecated ``fp16`` spelling that
    DeepSpeed maps onto it); DeepSpeed's default is false."""
    return any(_bool(zero, key, False, "zero_optimization.") for key in GATHER_ON_SAVE_KEYS if key in zero)


MAX_BATCH = 2**31  # samples: beyond any real global batch (and what the schema's micro-batch × ranks allows)


DEFAULT_MICRO = DEFAULT_ACCUM = 1  # what a config that leaves them open trains with


def _batch_sizes(config: dict[str, Any], world: int) -> tuple[int, int, int]:
    """(micro-batch, accumulation steps, global batch) by DeepSpeed's rules."""
    total = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    for key, value in (
        ("train_batch_size", total),
        ("train_micro_batch_size_per_gpu", micro),
        ("gradient_accumulation_steps", accum),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            if value == "auto":
                raise ConfigError(key, '"auto" is a Hugging Face Trainer placeholder; give a number')
            raise ConfigError(key, f"must be a positive integer, got {value!r}")
        if value is not None and value > MAX_BATCH:  # no run trains 10**40 samples at once: a typo, refused early
            raise ConfigError(key, f"must be at most {MAX_BATCH}, got {value}")
    if micro is None and accum is None and total is None:
        micro, accum = DEFAULT_MICRO, DEFAULT_ACCUM
    elif micro is None and total is not None:
        accum = accum or 1
        if total % (accum * world):
            raise ConfigError(
                "train_batch_size",
                f"{total} is not divisible by gradient_accumulation_steps × world size = {accum * world}",
            )
        micro = total // (accum * world)
    elif accum is None:
        micro = micro or DEFAULT_MICRO
        if total is None:
            accum = DEFAULT_ACCUM
        elif total % (micro * world):
            raise ConfigError(
                "train_batch_size", f"{total} is not divisible by micro-batch × world size = {micro * world}"
            )
        else:
            accum = total // (micro * world)
    if micro is None:
        micro = DEFAULT_MICRO
    expected = micro * accum * world
    if total is not None and total != expected:
        raise ConfigError(
            "train_batch_size",
            f"{total} != micro-batch {micro} × gradient_accumulation_steps {accum} × world size {world} = {expected}",
        )
    if micro <= 0 or accum <= 0:
        raise ConfigError("train_batch_size", "resolves to a batch of zero")
    return micro, accum, expected


def _check_optimizer(config: dict[str, Any]) -> None:
    optimizer = _section(config, "optimizer")
    kind = optimizer.get("type", "AdamW")
    if not isinstance(kind, str) or kind.lower() not in ADAM_FAMILY:
        raise ConfigError("optimizer.type", f"the estimator models Adam-family optimizers, got {kind!r}")
