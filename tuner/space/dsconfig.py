"""DeepSpeed config dicts: build one from the CLI's shortcut flags, load, merge and validate them.

Pure Python at import time: :func:`validate_with_deepspeed` imports DeepSpeed only when called.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from pathlib import Path
from typing import Any

from tuner.workload import ConfigError, TrainableSpec, TrialConfig
from tuner.workload.numerics import numerics_notes
from tuner.workload.trial import PRECISION_SECTIONS

DEFAULT_LR = 1e-4


def shortcut_config(
    micro_batch: int,
    grad_accum: int,
    precision: str,
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    nvme_path: str | None = None,
) -> dict[str, Any]:
    """A DeepSpeed config dict from the shortcut flags of ``dstune estimate``.

    Args:
        micro_batch: ``train_micro_batch_size_per_gpu``.
        grad_accum: ``gradient_accumulation_steps``.
        precision: ``bf16``, ``fp16`` or ``fp32`` (fp32 adds no precision section).
        stage: ZeRO stage 0-3.
        offload_optimizer: ``none``, ``cpu`` or ``nvme``.
        offload_param: ``none``, ``cpu`` or ``nvme``.
        nvme_path: Folder for NVMe offload; set on each offload section whose device is ``nvme``.

    Returns:
        A fresh config dict.
    """
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": DEFAULT_LR}},
    }
    if precision in PRECISION_SECTIONS:
        config[PRECISION_SECTIONS[precision]] = {"enabled": True}
    zero: dict[str, Any] = {"stage": stage}
    for key, device in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if device != "none":
            zero[key] = _offload_section(device, nvme_path)
    config["zero_optimization"] = zero
    return config


def _offload_section(device: str, nvme_path: str | None) -> dict[str, Any]:
    section: dict[str, Any] = {"device": device}
    if device == "nvme" and nvme_path:
        section["nvme_path"] = nvme_path
    return section


def load_ds_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed config JSON file.

    Raises:
        ConfigError: (field ``ds-config``) the file is missing, unreadable, not JSON, or not a JSON object.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError("ds-config", f"no such file: {file}")
    try:
        config = json.loads(file.read_text())
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        RecursionError,
    ) as error:  # RecursionError: absurd nesting
        raise ConfigError("ds-config", f"cannot read {file} as JSON: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError("ds-config", f"{file} must hold a JSON object, got {type(config).__name__}")
    return config


def merge_configs(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` over ``base``: nested dicts merge key by key, other values of ``override`` win.

    Neither input is modified.

    Example:
        >>> merge_configs({"zero_optimization": {"stage": 1, "overlap_comm": True}},
        ...               {"zero_optimization": {"stage": 3}})
        {'zero_optimization': {'stage': 3, 'overlap_comm': True}}
    """
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_configs(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def validate_with_deepspeed(config: dict[str, Any], world_size: int) -> None:
    """Validate ``config`` with DeepSpeed's own config classes, as ``deepspeed.initialize`` would.

    Checks the ``zero_optimization`` section with ``DeepSpeedZeroConfig`` (so the offending key is named),
    then the whole config with ``DeepSpeedConfig`` at ``world_size`` data-parallel ranks (batch-size
    arithmetic and the other sections).

    Raises:
        ConfigError: DeepSpeed rejects the config; ``field`` is the dotted key where DeepSpeed names one.
        ImportError: DeepSpeed is not installed.
    """
    import pydantic

    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's logger writes to the stdout it finds at import
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ConfigError("zero_optimization", f"must be an object, got {type(zero).__name__}")
    try:
        DeepSpeedZeroConfig(**zero)
    except pydantic.ValidationError as error:
        raise _config_error(error, "zero_optimization") from None
    try:
        _deepspeed_config(DeepSpeedConfig, config, world_size)
    except pydantic.ValidationError as error:
        raise _config_error(error, _section_of(config, error)) from None
    except (AssertionError, ValueError, TypeError, KeyError) as error:
        raise ConfigError("ds_config", f"DeepSpeed rejects it: {error}") from None


def _deepspeed_config(config_class: type[Any], config: dict[str, Any], world_size: int) -> Any:
    """Build ``DeepSpeedConfig`` for ``world_size`` ranks without an initialised process group."""
    ds_config = object.__new__(config_class)  # skips __init__, which needs a process group
    ds_config._param_dict = config
    ds_config.global_rank = 0
    ds_config.world_size = world_size
    ds_config._initialize_params(copy.copy(config))
    ds_config._configure_train_batch_size()
    ds_config._do_sanity_check()
    return ds_config


def _section_of(config: dict[str, Any], error: Any) -> str:
    """The top-level section whose object holds the key a nested DeepSpeed model rejected ("" if none)."""
    location = error.errors()[0].get("loc", ())
    if location:
        for key, value in config.items():
            if isinstance(value, dict) and location[0] in value:
                return key
    return ""


def _config_error(error: Any, prefix: str) -> ConfigError:
    """The first pydantic error as a :class:`ConfigError` naming its dotted key under ``prefix``."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first.get("loc", ()))
    field_name = ".".join(part for part in (prefix, location) if part) or "ds_config"
    return ConfigError(field_name, f"{first.get('msg', 'invalid')} (DeepSpeed rejects it)")


# Keys the Hugging Face Trainer fills from its TrainingArguments when they say "auto".
HF_AUTO_TOP_LEVEL = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


# dstune's attention kind -> the attn_implementation to load the model with in transformers
HF_ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}


def hf_attn_implementation(attention: str) -> str:
    """The ``attn_implementation`` that trains the model a study tuned (its workload's attention, which is the one
    transformers resolved for the model unless the user chose another): the estimate holds for that one only.

    >>> hf_attn_implementation("eager")
    'eager'
    """
    return HF_ATTENTION[attention]


def to_hf_trainer(config: dict[str, Any], activation_checkpointing: bool = False) -> tuple[dict[str, Any], dict]:
    """The Hugging Face Trainer variant of a tuned ds_config, and the TrainingArguments that must go with it.

    Batch sizes, precision switches and optimizer hyper-parameters become ``"auto"`` (the Trainer fills them from
    its arguments, so they cannot disagree); the tuned ZeRO settings stay explicit.

    Example:
        >>> hf, args = to_hf_trainer({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        ...                           "train_batch_size": 64, "bf16": {"enabled": True},
        ...                           "zero_optimization": {"stage": 2}})
        >>> hf["train_micro_batch_size_per_gpu"], args["per_device_train_batch_size"], args["bf16"]
        ('auto', 4, True)
    """
    hf = json.loads(json.dumps(config))
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.get("train_micro_batch_size_per_gpu"),
        "gradient_accumulation_steps": config.get("gradient_accumulation_steps", 1),
        "bf16": bool(config.get("bf16", {}).get("enabled", False)),
        "fp16": bool(config.get("fp16", {}).get("enabled", False)),
        "gradient_checkpointing": activation_checkpointing,
    }
    for key in HF_AUTO_TOP_LEVEL:
        if key in hf:
            hf[key] = "auto"
    for precision in ("bf16", "fp16"):
        if isinstance(hf.get(precision), dict):
            hf[precision]["enabled"] = "auto"
    optimizer = hf.get("optimizer")
    if isinstance(optimizer, dict) and isinstance(optimizer.get("params"), dict):
        for name in ("lr", "betas", "eps", "weight_decay"):
            if name in optimizer["params"]:
                optimizer["params"][name] = "auto"
    return hf, args


# adapter_config.json fields that describe a saved adapter, not the one to create (LoraConfig's bookkeeping)
SAVED_ADAPTER_FIELDS = ("base_model_name_or_path", "revision", "peft_version", "auto_mapping", "inference_mode")


def lora_config_fields(adapter: dict[str, Any]) -> dict[str, Any]:
    """The ``peft.LoraConfig(**fields)`` of a workload's adapter config, for training a causal LM: its own fields
    without a saved adapter's bookkeeping, ``task_type`` CAUSAL_LM.

    Example:
        >>> lora_config_fields({"r": 8, "target_modules": ["q_proj"], "base_model_name_or_path": "x"})
        {'r': 8, 'target_modules': ['q_proj'], 'task_type': 'CAUSAL_LM'}
    """
    fields = {key: value for key, value in adapter.items() if key not in (*SAVED_ADAPTER_FIELDS, "peft_type")}
    return {**fields, "task_type": "CAUSAL_LM"}


def trainable_notes(trainable: TrainableSpec) -> list[str]:
    """What must go with an exported config when not every parameter trained: the peft ``LoraConfig`` (one JSON
    object) to wrap the model with before the Trainer gets it, and the freeze pattern."""
    notes = []
    adapter = trainable.peft_config
    if adapter is not None:
        notes.append(
            "peft LoraConfig to wrap the model with (peft.get_peft_model) before the Trainer: "
            + json.dumps(lora_config_fields(adapter))
        )
    if trainable.freeze:
        notes.append(f"freeze the parameters whose names match {json.dumps(trainable.freeze)} (requires_grad False)")
    return notes


def export_config(
    trial: TrialConfig,
    format: str = "deepspeed",
    attention: str | None = None,
    trainable: TrainableSpec | None = None,
    seq_len: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """What ``dstune best`` writes for a trial: the config DeepSpeed gets (``format="hf"``: the Trainer's variant)
    and the notes that go with it (the TrainingArguments and, given the workload's ``attention``, the
    ``attn_implementation`` to load the model with; given its ``trainable`` part, the peft ``LoraConfig`` and the
    freeze pattern; the allocator setting the run was measured with). A trial with Ulysses or ALST's pieces adds
    what the training code must do for them (:mod:`tuner.space.long_context_export`; ``seq_len``: the workload's), one
    with AutoTP or hpZ what goes with those (:mod:`tuner.space.tensor_parallel_export`).

    Example:
        >>> trial = TrialConfig({"train_micro_batch_size_per_gpu": 2, "dstune": {"expandable_segments": True}})
        >>> config, notes = export_config(trial)
        >>> config, notes
        ({'train_micro_batch_size_per_gpu': 2}, ['run it with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True'])
    """
    from tuner.space.long_context_export import alst_notes, deepspeed_notes, hf_snippet
    from tuner.space.tensor_parallel_export import tensor_parallel_notes

    config = trial.deepspeed_config()
    notes: list[str] = []
    kind = attention or "sdpa"
    if format == "hf":
        config, args = to_hf_trainer(config, trial.activation_checkpointing)
        note = "TrainingArguments to use with it: " + json.dumps(args)
        if attention is not None:
            note += f'; load the model with attn_implementation="{hf_attn_implementation(attention)}"'
        notes.append(note)
        snippet = hf_snippet(trial, kind, seq_len)
        notes.extend([snippet] if snippet else [])
        notes.extend(alst_notes(trial))
    else:
        notes.extend(deepspeed_notes(trial, kind, seq_len))
    notes.extend(tensor_parallel_notes(trial, format))
    if trainable is not None:
        notes.extend(trainable_notes(trainable))
    if trial.expandable_segments:
        notes.append("run it with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    notes.extend(numerics_notes(trial.numerics))
    return config, notes
