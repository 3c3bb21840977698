"""The model as trained: a workload's :class:`~tuner.workload.TrainableSpec` applied to a transformers model.

The adapter is added with the real ``peft`` library (LoRA only; ``inference_mode`` forced False, as training
builds it; its regular expressions resolved to module names with RE2 first, :mod:`tuner.profile.adapter_patterns`),
then the parameters whose names the ``freeze`` pattern matches (``re.search``, by RE2) are frozen. Works on the
``meta`` device (profiles) and on real tensors (measured runs). Every refusal is a
:class:`~tuner.workload.WorkloadError` naming the adapter field (``peft.r``, ``peft.target_modules``...) or
``freeze``, never a traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from tuner.errors import InputError
from tuner.profile.adapter_patterns import resolved_adapter
from tuner.workload import TrainableSpec, WorkloadError
from tuner.workload.patterns import compile_pattern

# peft's bookkeeping fields: any value is accepted (they do not change the model that trains)
METADATA_FIELDS = frozenset(
    {"auto_mapping", "base_model_name_or_path", "revision", "peft_version", "inference_mode", "task_type"}
)
# fields whose non-default value needs another library, another device or a special initialisation
UNSUPPORTED_FIELDS = frozenset(
    {
        "megatron_config",
        "megatron_core",
        "loftq_config",
        "eva_config",
        "corda_config",
        "lora_ga_config",
        "velora_config",
        "monteclora_config",
        "arrow_config",
        "kasa_config",
        "use_qalora",
        "use_bdlora",
        "alora_invocation_tokens",
        "runtime_config",
    }
)
TASK_TYPES = ("CAUSAL_LM",)


def _lora_fields() -> dict[str, dataclasses.Field[Any]]:
    from peft import LoraConfig

    return {item.name: item for item in dataclasses.fields(LoraConfig)}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _names(value: Any, field: str) -> list[str] | str | None:
    """A module-name list (or one regex string) field, checked."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise WorkloadError(f"peft.{field}", "must be a list of module names (or one regular expression)")


def _check_fields(adapter: dict[str, Any]) -> dict[str, Any]:
    """The adapter config's fields for ``LoraConfig``, each checked (one field named per refusal)."""
    known = _lora_fields()
    peft_type = adapter.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise WorkloadError("peft.peft_type", f"only LORA adapters are supported, got {peft_type!r}")
    task_type = adapter.get("task_type")
    if task_type is not None and task_type not in TASK_TYPES:
        raise WorkloadError("peft.task_type", f"only CAUSAL_LM (or none) is supported, got {task_type!r}")
    for key in adapter:
        if key not in known:
            raise WorkloadError(f"peft.{key}", "not a field of peft's LoraConfig")
        if key in UNSUPPORTED_FIELDS and adapter[key] not in (None, False, [], {}):
            raise WorkloadError(f"peft.{key}", "not supported by dstune (it needs another library or device)")
    fields = {key: value for key, value in adapter.items() if key not in METADATA_FIELDS and key != "peft_type"}
    if not _positive_int(fields.get("r", 8)):
        raise WorkloadError("peft.r", f"must be a positive integer, got {fields.get('r')!r}")
    if not _number(fields.get("lora_alpha", 8)):
        raise WorkloadError("peft.lora_alpha", f"must be a number, got {fields.get('lora_alpha')!r}")
    dropout = fields.get("lora_dropout", 0.0)
    if not _number(dropout) or not 0 <= dropout < 1:
        raise WorkloadError("peft.lora_dropout", f"must be a number in [0, 1), got {dropout!r}")
    if fields.get("bias", "none") not in ("none", "all", "lora_only"):
        raise WorkloadError("peft.bias", f"must be none, all or lora_only, got {fields.get('bias')!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = fields.get(key) or {}
        if not isinstance(pattern, dict):
            raise WorkloadError(f"peft.{key}", "must be an object of module-name patterns")
        for name, value in pattern.items():
            if not (_positive_int(value) if key == "rank_pattern" else _number(value)):
                raise WorkloadError(f"peft.{key}.{name}", f"must be a positive integer, got {value!r}")
    for key in ("use_dora", "use_rslora", "fan_in_fan_out", "lora_bias"):
        if not isinstance(fields.get(key, False), bool):
            raise WorkloadError(f"peft.{key}", "must be true or false")
    for key in ("target_modules", "exclude_modules", "modules_to_save", "target_parameters"):
        if key in fields:
            _names(fields[key], key)
    init = fields.get("init_lora_weights", True)
    if not isinstance(init, bool) and init not in ("gaussian", "orthogonal"):
        raise WorkloadError(
            "peft.init_lora_weights", f"true, false, gaussian or orthogonal (SVD-based inits are not run), got {init!r}"
        )
    return fields


def lora_config(adapter: dict[str, Any]) -> Any:
    """peft's ``LoraConfig`` of an adapter config object, for training (``inference_mode=False``)."""
    from peft import LoraConfig

    fields = _check_fields(adapter)
    if not fields.get("target_modules") and not fields.get("target_parameters"):
        raise WorkloadError("peft.target_modules", 'give the modules to adapt (e.g. ["q_proj", "v_proj"])')
    try:
        return LoraConfig(**fields, task_type="CAUSAL_LM", inference_mode=False)
    except (ValueError, TypeError, NotImplementedError) as error:
        raise WorkloadError("peft", f"peft rejects the adapter config: {' '.join(str(error).split())}") from None


def _check_named(model: torch.nn.Module, names: Iterable[str], field: str) -> None:
    """Each entry of a module-name list names a module of the model (peft ignores one that does not, as long as
    another matches: a typo would silently train less)."""
    modules = [name for name, _ in model.named_modules()]
    for target in names:
        if not any(name == target or name.endswith(f".{target}") for name in modules):
            raise WorkloadError(f"peft.{field}", f"{target!r} not found in the model")


def _shown(names: Any) -> str:
    return ", ".join(sorted(names)) if isinstance(names, (set, list, tuple)) else repr(names)


def add_adapter(model: torch.nn.Module, adapter: dict[str, Any]) -> torch.nn.Module:
    """The peft model of ``model`` with the LoRA adapter of ``adapter`` (peft's ``get_peft_model``)."""
    from peft import get_peft_model
    from peft.utils.error import NoMatchingPeftModuleError

    _check_fields(adapter)  # each field named as given, before its patterns become module names
    config = lora_config(resolved_adapter(adapter, [name for name, _ in model.named_modules()]))
    _check_named(model, config.modules_to_save or (), "modules_to_save")
    if not isinstance(config.target_modules, str):  # "all-linear" (other strings were resolved to names)
        _check_named(model, (name for name in config.target_modules or () if name != "all-linear"), "target_modules")
    try:
        peft_model = get_peft_model(model, config)
    except NoMatchingPeftModuleError:
        raise WorkloadError("peft.target_modules", f"{_shown(config.target_modules)} not found in the model") from None
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as error:
        message = " ".join(str(error).split())
        field = "peft.target_modules" if "target module" in message.lower() else "peft"
        raise WorkloadError(field, f"peft cannot add the adapter: {message}") from None
    return peft_model


def freeze_matching(model: torch.nn.Module, pattern: str, strict: bool = True) -> None:
    """Freeze the parameters whose names ``pattern`` matches (``re.search``, run by RE2: linear time); refused when
    it matches none or leaves nothing trainable (``strict=False``: either is let be, for a profile's copy that keeps
    only some layers: the whole model is checked where its parameters are counted)."""
    try:
        regex = compile_pattern(pattern, "freeze")
    except InputError as error:
        raise WorkloadError(error.field, error.message) from None
    named = list(model.named_parameters())
    matched = [param for name, param in named if regex.search(name)]
    if not matched and strict:
        example = named[0][0] if named else "model.embed_tokens.weight"
        raise WorkloadError("freeze", f"{pattern!r} matches no parameter name (names look like {example})")
    for param in matched:
        param.requires_grad_(False)
    if strict and not any(param.requires_grad for _, param in named):
        raise WorkloadError("freeze", f"{pattern!r} leaves no parameter trainable")


def apply_trainable(model: torch.nn.Module, trainable: TrainableSpec, strict: bool = True) -> torch.nn.Module:
    """The model to train: ``model`` with the adapter of ``trainable.peft`` (if any) added, then the parameters
    matching ``trainable.freeze`` (if any) frozen. Full fine-tuning returns ``model`` itself. ``strict=False``:
    see :func:`freeze_matching`."""
    adapter = trainable.peft_config
    if adapter is not None:
        model = add_adapter(model, adapter)
    if trainable.freeze:
        freeze_matching(model, trainable.freeze, strict)
    return model


def trainable_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter elements, tied weights once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


__all__ = ["add_adapter", "apply_trainable", "freeze_matching", "lora_config", "trainable_counts"]
