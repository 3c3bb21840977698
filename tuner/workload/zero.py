"""The ``zero_optimization`` section of a ds_config, read once into typed values with DeepSpeed 0.19's defaults.

Unknown keys and bad values are refused the way DeepSpeed's own pydantic models refuse them, naming the key
(:class:`~tuner.workload.config_values.ConfigError`). Stage-3 keys are read under their ``stage3_`` alias or their
plain field name, as DeepSpeed accepts both. What the ZeRO paper leaves open follows DeepSpeed: ``overlap_comm``
defaults to true at stage 3 only; optimizer offload needs stage 1-3 and NVMe optimizer offload stage 3; parameter
offload needs stage 3; ZeRO-1/2's all-gather bucket is a multiple of 2 (its NCCL alignment).

Example:
    >>> zero = ZeroConfig.of({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    >>> zero.stage, zero.overlap_comm, zero.offload_param.device, zero.offload_param.pin_memory
    (3, True, 'cpu', True)
    >>> ZeroConfig.of({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: zero_optimization.offload_param.device: parameter offload needs ZeRO ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tuner.workload.config_values import ConfigError, content_key, read_bool, read_int, section

PREFIX = "zero_optimization."
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
OffloadDevice = Literal["none", "cpu", "nvme"]
OFFLOAD_DEVICES: tuple[str, ...] = get_args(OffloadDevice)
GATHER_ON_SAVE_KEYS = (
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save",
)
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce and all-gather bucket sizes, in elements
MAX_READ = 4096  # distinct sections kept read (:meth:`ZeroConfig.of`)


@dataclass(frozen=True, slots=True)
class Offload:
    """One offload section (``offload_optimizer`` or ``offload_param``); ``device`` is ``none``, ``cpu`` or ``nvme``."""

    device: str = "none"
    pin_memory: bool = True
    buffer_count: int = 4
    buffer_size: int = 100_000_000
    nvme_path: str | None = None

    @property
    def on(self) -> bool:
        """Whether anything is offloaded."""
        return self.device != "none"


def _device(values: Mapping[str, Any], prefix: str) -> str:
    device = values.get("device", "none")
    if device is None:
        return "none"
    if device not in OFFLOAD_DEVICES:
        raise ConfigError(f"{prefix}device", f"must be one of none, cpu, nvme, got {device!r}")
    return str(device)


def offload_device(ds_config: Mapping[str, Any], key: str) -> str:
    """The device an offload section (``offload_optimizer`` or ``offload_param``) names, nothing else checked: what
    decides which compiled ops a run loads, before DeepSpeed judges the rest."""
    zero = section(ds_config, "zero_optimization")
    return _device(section(zero, key, PREFIX), f"{PREFIX}{key}.")


def _offload(zero: dict[str, Any], key: str, allowed: frozenset[str], buffer_count: int) -> Offload:
    values = section(zero, key, PREFIX)
    prefix = f"{PREFIX}{key}."
    for name in values.keys() - allowed:
        raise ConfigError(f"{prefix}{name}", "unknown key (DeepSpeed rejects it)")
    device = _device(values, prefix)
    if device == "nvme" and not values.get("nvme_path"):
        raise ConfigError(f"{prefix}nvme_path", "required when device is nvme")
    return Offload(
        device=device,
        pin_memory=read_bool(values, "pin_memory", True, prefix),
        buffer_count=read_int(values, "buffer_count", buffer_count, prefix),
        buffer_size=read_int(values, "buffer_size", 100_000_000, prefix),
        nvme_path=values.get("nvme_path"),
    )


def _stage3_int(zero: dict[str, Any], name: str, default: int) -> int:
    """A stage-3 key given under its ``stage3_`` alias or its plain field name."""
    key = f"stage3_{name}" if f"stage3_{name}" in zero else name
    return read_int(zero, key, default, PREFIX)


def _stage(zero: dict[str, Any]) -> int:
    for name in sorted(zero.keys() - ZERO_KEYS):
        raise ConfigError(f"{PREFIX}{name}", "unknown key (DeepSpeed rejects it)")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError(f"{PREFIX}stage", f"must be 0, 1, 2 or 3, got {stage!r}")
    return int(stage)


def _check_offloads(stage: int, optimizer: Offload, param: Offload) -> None:
    if optimizer.on and stage == 0:
        raise ConfigError(f"{PREFIX}offload_optimizer.device", "optimizer offload needs ZeRO stage 1, 2 or 3")
    if param.on and stage != 3:
        raise ConfigError(f"{PREFIX}offload_param.device", f"parameter offload needs ZeRO stage 3, got stage {stage}")
    if optimizer.device == "nvme" and stage != 3:
        raise ConfigError(f"{PREFIX}offload_optimizer.device", "NVMe optimizer offload needs ZeRO stage 3")


@dataclass(frozen=True, slots=True)
class ZeroConfig:
    """The ``zero_optimization`` section, every value resolved (DeepSpeed's default where the config is silent)."""

    stage: int = 0
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_bucket_size: int = DEFAULT_BUCKET
    allgather_bucket_size: int = DEFAULT_BUCKET
    offload_optimizer: Offload = Offload()
    offload_param: Offload = Offload(buffer_count=5)
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    model_persistence_threshold: int = 2**63 - 1
    sub_group_size: int = 1_000_000_000
    round_robin_gradients: bool = False
    memory_efficient_linear: bool = True
    gather_16bit_on_save: bool = False
    quantized_weights: bool = False
    quantized_gradients: bool = False
    quantized_nontrainable: bool = False  # zero_quantized_nontrainable_weights, as given (DeepSpeed: stage 3 only)
    reduce_scatter: bool = True
    multi_rank_bucket_allreduce: bool = True

    @classmethod
    def of(cls, ds_config: Mapping[str, Any]) -> ZeroConfig:
        """Read and check ``ds_config["zero_optimization"]``.

        Raises:
            ConfigError: an unknown key, a bad value or a combination DeepSpeed refuses, naming its key.
        """
        zero = section(ds_config, "zero_optimization")
        key = content_key(zero)  # a search repeats few sections over many configs: each is read once
        found = _READ.get(key) if key is not None else None
        if found is None:
            found = cls._read(zero)
            if key is not None and len(_READ) < MAX_READ:
                _READ[key] = found
        return found

    @classmethod
    def _read(cls, zero: dict[str, Any]) -> ZeroConfig:
        stage = _stage(zero)
        overlap = zero.get("overlap_comm")
        optimizer = _offload(zero, "offload_optimizer", OFFLOAD_OPTIMIZER_KEYS, 4)
        param = _offload(zero, "offload_param", OFFLOAD_PARAM_KEYS, 5)
        _check_offloads(stage, optimizer, param)
        read_int(zero, "zero_hpz_partition_size", 1, PREFIX)  # checked in its place; the degree is the layout's
        allgather = read_int(zero, "allgather_bucket_size", DEFAULT_BUCKET, PREFIX)
        if stage in (1, 2) and allgather % 2:
            raise ConfigError(f"{PREFIX}allgather_bucket_size", "must be a multiple of 2 (DeepSpeed's NCCL alignment)")
        return cls(
            stage=stage,
            overlap_comm=stage == 3 if overlap is None else read_bool(zero, "overlap_comm", stage == 3, PREFIX),
            contiguous_gradients=read_bool(zero, "contiguous_gradients", True, PREFIX),
            reduce_bucket_size=read_int(zero, "reduce_bucket_size", DEFAULT_BUCKET, PREFIX, minimum=1),
            allgather_bucket_size=allgather,
            offload_optimizer=optimizer,
            offload_param=param,
            max_live_parameters=_stage3_int(zero, "max_live_parameters", 1_000_000_000),
            max_reuse_distance=_stage3_int(zero, "max_reuse_distance", 1_000_000_000),
            prefetch_bucket_size=_stage3_int(zero, "prefetch_bucket_size", 50_000_000),
            param_persistence_threshold=_stage3_int(zero, "param_persistence_threshold", 100_000),
            model_persistence_threshold=_stage3_int(zero, "model_persistence_threshold", 2**63 - 1),
            sub_group_size=read_int(zero, "sub_group_size", 1_000_000_000, PREFIX),
            round_robin_gradients=read_bool(zero, "round_robin_gradients", False, PREFIX),
            memory_efficient_linear=read_bool(zero, "memory_efficient_linear", True, PREFIX),
            gather_16bit_on_save=any(read_bool(zero, key, False, PREFIX) for key in GATHER_ON_SAVE_KEYS if key in zero),
            quantized_weights=read_bool(zero, "zero_quantized_weights", False, PREFIX),
            quantized_gradients=read_bool(zero, "zero_quantized_gradients", False, PREFIX),
            quantized_nontrainable=read_bool(zero, "zero_quantized_nontrainable_weights", False, PREFIX),
            reduce_scatter=read_bool(zero, "reduce_scatter", True, PREFIX),
            multi_rank_bucket_allreduce=read_bool(zero, "use_multi_rank_bucket_allreduce", True, PREFIX),
        )


_READ: dict[tuple[Any, ...], ZeroConfig] = {}  # content_key of a section -> the section read

__all__ = [
    "OFFLOAD_DEVICES",
    "OFFLOAD_OPTIMIZER_KEYS",
    "OFFLOAD_PARAM_KEYS",
    "ZERO_KEYS",
    "Offload",
    "OffloadDevice",
    "ZeroConfig",
    "offload_device",
]
