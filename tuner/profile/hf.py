"""Transformers models from a ``config.json`` dict: validation, construction, and parameter facts on ``meta``.

Imports torch and transformers. Nothing is ever downloaded (``HF_HUB_OFFLINE``); configs that ask for custom code
(``auto_map``, ``trust_remote_code``) are refused. Every refusal is a :class:`~tuner.workload.WorkloadError` naming
the config field (``model.<key>``).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
import transformers
from torch import nn
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tuner.profile.build_bound import build_bound
from tuner.profile.config_checks import refuse_custom_code
from tuner.profile.mha_transformer import MODEL_TYPE as MHA_TRANSFORMER  # registered with transformers' Auto classes
from tuner.profile.model_parts import (
    config_value,
    expert_modules,
    layer_kinds,
    position_table,
    text_config,
    tied_embeddings,
)
from tuner.profile.quiet_logs import quiet
from tuner.profile.tp_plan import autotp_sharded
from tuner.workload import ModelProfile, TrainableSpec, WorkloadError

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# dstune's attention kind -> transformers' attn_implementation it is traced and run with (``flash``: CPU SDPA's flash
# path saves output and log-sum-exp, as flash attention does; the maths are the same exact attention)
ATTN_IMPLEMENTATIONS = {"sdpa": "sdpa", "flash": "sdpa", "eager": "eager"}


def check_config(config: Any) -> str:
    """The ``model_type`` of a config transformers can build as a causal LM without custom code."""
    model_type = refuse_custom_code(config)["model_type"]
    if model_type == MHA_TRANSFORMER:  # dstune's own (:mod:`tuner.profile.mha_transformer`)
        return model_type
    if model_type not in CONFIG_MAPPING_NAMES:
        raise WorkloadError(
            "model.model_type", f"unknown model_type {model_type!r} for transformers {transformers.__version__}"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise WorkloadError("model.model_type", f"{model_type!r} has no causal language model in transformers")
    return model_type


# what transformers' messages call the standard config attributes ("embed_dim must be divisible by num_heads")
MESSAGE_NAMES = {"num_heads": "num_attention_heads", "embed_dim": "hidden_size", "n_heads": "num_attention_heads"}


def _rejected_field(config: dict[str, Any], message: str) -> str:
    """The config key a transformers error message names (the longest it mentions, ``_`` or spaces; a standard name
    in the message, e.g. ``num_heads``, maps to the key the config spells it with, e.g. GPT-2's ``n_head``), else
    ``model``."""
    named = [key for key in config if key != "model_type" and (key in message or key.replace("_", " ") in message)]
    if not named:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        model_type = str(config.get("model_type"))
        config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401 (a lazy mapping: .get misses)
        spelled = getattr(config_class, "attribute_map", {}) if config_class is not None else {}
        for said, standard in MESSAGE_NAMES.items():
            key = spelled.get(standard, standard)
            if said in message and key in config:
                named.append(key)
    return f"model.{max(named, key=len)}" if named else "model"


def hf_config(config: dict[str, Any], **overrides: Any) -> Any:
    """The transformers config object of a ``config.json`` dict; ``overrides`` replace fields of its text config
    (the config itself, or the ``text_config`` of a composite model: Gemma-3, Qwen3.5, Emu3...)."""
    check_config(config)
    values = {key: value for key, value in config.items() if key not in ("architectures", "transformers_version")}
    model_type = values.pop("model_type")
    built = _config_object(config, model_type, values)
    if not overrides:
        return built
    text = text_config(built)
    key = next((name for name in getattr(built, "sub_configs", {}) if getattr(built, name, None) is text), None)
    if text is built or key is None:
        return _config_object(config, model_type, {**values, **overrides})
    nested = text.to_dict()
    layers = getattr(text, "num_hidden_layers", None)
    new_layers = overrides.get("num_hidden_layers", layers)
    for name, value in nested.items():  # per-layer lists (layer_types...) follow a shorter model
        if isinstance(value, list) and isinstance(layers, int) and len(value) == layers:
            nested[name] = value[:new_layers]
    return _config_object(config, model_type, {**values, key: {**nested, **overrides}})


def _config_object(config: dict[str, Any], model_type: str, values: dict[str, Any]) -> Any:
    """The config object of ``values``; the floats JSON cannot hold (``time_step_limit``'s infinity), which
    transformers 5 writes as ``{"__float__": "Infinity"}``, decoded as transformers decodes its own files."""
    values = transformers.PreTrainedConfig._decode_special_floats(values)
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except Exception as error:  # transformers raises ValueError, TypeError, AttributeError... for bad values
        message = " ".join(str(error).split()) or type(error).__name__
        raise WorkloadError(_rejected_field(config, message), f"transformers rejects the config: {message}") from None


def text_attention(config_object: Any, implementation: str) -> str | dict[str, str]:
    """The ``attn_implementation`` argument that makes the decoder layers run ``implementation``: the name itself,
    or for a composite model (text config a sub-config: GOT-OCR2, Gemma-3...) ``{text key: name}``, its other parts
    (top level, vision tower) keeping transformers' own choice, as they run in the model transformers builds. A
    name alone would be set on every sub-config: GOT-OCR2's top level and vision tower resolve eager, its Qwen2
    text model SDPA, and the whole model traced eager saved each layer's attention weights (+14 to +39 %)."""
    text = text_config(config_object)
    key = next(
        (name for name in getattr(config_object, "sub_configs", {}) if getattr(config_object, name, None) is text), None
    )
    return {key: implementation} if text is not config_object and key is not None else implementation


def attention_kind(implementation: str) -> str:
    """dstune's attention kind of a transformers ``attn_implementation`` (``flash_attention_2`` -> ``flash``)."""
    if implementation in ("sdpa", "eager"):
        return implementation
    if implementation.startswith("flash"):
        return "flash"
    raise WorkloadError(
        "attention", f"transformers builds this model with {implementation!r}, which dstune cannot trace"
    )


def _model_class_name(config_object: Any) -> str:
    mapping: Any = transformers.AutoModelForCausalLM._model_mapping
    try:
        return str(mapping[type(config_object)].__name__)
    except KeyError:
        return type(config_object).__name__


def build(
    config: dict[str, Any],
    attention: str | None = None,
    dtype: torch.dtype | None = None,
    bounded: bool = True,
    **overrides: Any,
) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` with random weights on the current device (or fake/meta mode), within
    :func:`tuner.profile.build_bound.build_bound` unless not ``bounded`` (a measured rank's real model: its host
    memory is checked before the run, :mod:`tuner.measure.driver.host_memory`).

    ``attention`` None: the implementation transformers resolves for the config (SDPA where the class supports it,
    else eager); else the decoder layers' (:func:`text_attention`). A kind the class cannot run is refused
    (:class:`WorkloadError` naming ``attention``), never replaced by something that computes other maths.
    """
    config_object = hf_config(config, **overrides)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attention is not None:
        kwargs["attn_implementation"] = text_attention(config_object, ATTN_IMPLEMENTATIONS[attention])
    try:
        with build_bound() if bounded else contextlib.nullcontext():
            model = transformers.AutoModelForCausalLM.from_config(config_object, **kwargs)
    except WorkloadError:
        raise
    except Exception as error:
        message = " ".join(str(error).split()) or type(error).__name__
        if attention is not None and ("attn_implementation" in message or "scaled_dot_product" in message):
            raise WorkloadError(
                "attention",
                f"{_model_class_name(config_object)} cannot run {attention} attention in transformers "
                f"{transformers.__version__}; leave attention unset (transformers' own choice) or pick another",
            ) from None
        raise WorkloadError(
            _rejected_field(config, message), f"transformers cannot build the model: {message}"
        ) from None
    if dtype is not None:
        _cast_to_training_dtype(model, dtype)
    return model


def _cast_to_training_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters that ``from_config(dtype=...)`` left in another dtype cast to ``dtype``, as DeepSpeed's
    engine casts the module it trains (``module.bfloat16()``): XLNet's attention weights, made with
    ``torch.FloatTensor``, stay fp32 in transformers and fail every bf16 matmul until cast. Those transformers keeps in
    fp32 on purpose (``_keep_in_fp32_modules_strict``: MoE routers, Mamba's ``A_log``) keep their dtype, as the
    real model built from the same file does."""
    keep = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    kept = re.compile("|".join(rf"(^|\.){re.escape(name)}($|\.)" for name in keep)) if keep else None
    cast: dict[int, nn.Parameter] = {}  # tied parameters stay one parameter
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            full = f"{module_name}.{name}" if module_name else name
            if param is None or not param.is_floating_point() or param.dtype == dtype:
                continue
            if kept is not None and kept.search(full):
                continue
            if id(param) not in cast:
                cast[id(param)] = nn.Parameter(param.detach().to(dtype), requires_grad=param.requires_grad)
            module._parameters[name] = cast[id(param)]


def supports_checkpointing(model: Any) -> bool:  # a transformers PreTrainedModel
    """Whether transformers can checkpoint the model's layers (``supports_gradient_checkpointing``)."""
    return bool(getattr(model, "supports_gradient_checkpointing", False))


def enable_checkpointing(model: Any) -> None:  # a transformers PreTrainedModel
    """transformers' activation (gradient) checkpointing of every decoder layer, non-reentrant, as training uses it;
    refused (naming ``activation-checkpointing``) for a class transformers cannot checkpoint."""
    if not supports_checkpointing(model):
        raise WorkloadError(
            "activation-checkpointing",
            f"{type(model).__name__} has no activation checkpointing in transformers {transformers.__version__}",
        )
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def describe(config: dict[str, Any]) -> ModelProfile:
    """Parameter facts of the model a ``config.json`` describes, counted on the ``meta`` device (no memory)."""
    with quiet(), torch.device("meta"):
        model: Any = build(config, dtype=torch.bfloat16)  # attention as transformers resolves it
    named = list(model.named_parameters())  # tied weights once
    by_dtype: dict[str, int] = {}
    for _, param in named:
        name = DTYPE_NAMES.get(param.dtype, str(param.dtype).removeprefix("torch."))
        by_dtype[name] = by_dtype.get(name, 0) + param.numel()
    largest_name, largest = max(named, key=lambda item: item[1].numel())
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else type(model).__name__
    return ModelProfile(
        model_type=model.config.model_type,
        architecture=str(architecture),
        transformers_version=transformers.__version__,
        n_params=sum(p.numel() for _, p in named),
        param_numels=tuple(p.numel() for _, p in named),
        param_elements_by_dtype=by_dtype,
        largest_param_name=largest_name,
        largest_param_numel=largest.numel(),
        layer_kinds=tuple(layer_kinds(model)),
        dims={**config_fields(text_config(model.config)), "position_table": position_table(model)},
        supports_checkpointing=supports_checkpointing(model),
        tied_embeddings=tied_embeddings(model),
        expert_modules=expert_modules(model),
        attention=attention_kind(str(text_config(model.config)._attn_implementation)),  # the decoder layers'
        tp_sharded=autotp_sharded(model),
    )


def describe_trained(config: dict[str, Any], trainable: TrainableSpec) -> ModelProfile:
    """Parameter facts of the model as trained: the config's model with ``trainable``'s adapter and freeze pattern
    applied by the real peft library (:mod:`tuner.profile.trainable`), on ``meta``. Every parameter of the peft
    model in model order (frozen base, adapters, ``modules_to_save`` copies: ZeRO-3 partitions them all), which
    train, their dtypes as built in bf16, the counts by dtype and the largest of each kind."""
    from tuner.profile.trainable import apply_trainable

    base = describe(config)
    quant = trainable.quant
    with quiet(), torch.device("meta"):
        model: Any = build(config, dtype=torch.bfloat16)
        quantized = quantized_params(model, quant.skip_modules) if quant is not None else set()
        model = apply_trainable(model, trainable)
    named = list(model.named_parameters())
    trainable_by: dict[str, int] = {}
    frozen_by: dict[str, int] = {}
    dtypes = []
    for _, param in named:
        name = DTYPE_NAMES.get(param.dtype, str(param.dtype).removeprefix("torch."))
        dtypes.append(name)
        into = trainable_by if param.requires_grad else frozen_by
        into[name] = into.get(name, 0) + param.numel()
    by_dtype = {key: trainable_by.get(key, 0) + frozen_by.get(key, 0) for key in {*trainable_by, *frozen_by}}
    largest_name, largest = max(named, key=lambda item: item[1].numel())
    trained = [(name, p) for name, p in named if p.requires_grad]
    frozen = [(name, p) for name, p in named if not p.requires_grad]
    top_trained = max(trained, key=lambda item: item[1].numel())
    top_frozen = max(frozen, key=lambda item: item[1].numel()) if frozen else ("", None)
    return ModelProfile(
        **{
            **base._static_fields(),
            "n_params": sum(p.numel() for _, p in named),
            "param_numels": tuple(p.numel() for _, p in named),
            "param_elements_by_dtype": by_dtype,
            "largest_param_name": largest_name,
            "largest_param_numel": largest.numel(),
            "trainable": tuple(p.requires_grad for _, p in named),
            "param_dtypes": tuple(dtypes),
            "trainable_elements_by_dtype": trainable_by,
            "frozen_elements_by_dtype": frozen_by,
            "largest_trainable_name": top_trained[0],
            "largest_trainable_numel": top_trained[1].numel(),
            "largest_frozen_name": top_frozen[0],
            "largest_frozen_numel": top_frozen[1].numel() if top_frozen[1] is not None else 0,
            "quantized": tuple(id(p) in quantized for _, p in named) if quantized else (),
            "tp_sharded": (),  # the peft model's names: AutoTP's split not read (the estimator's shapes then)
        }
    )


def quantized_params(model: Any, skip_modules: tuple[str, ...] | None) -> set[int]:
    """Ids of the weights transformers' bitsandbytes 4-bit quantizer replaces by ``Params4bit``.

    As ``Bnb4BitHfQuantizer._process_model_before_weight_loading`` and ``replace_with_bnb_linear`` do
    (transformers 5, ``quantizers/quantizer_bnb_4bit.py``, ``integrations/bitsandbytes.py``): every module whose type
    is exactly ``nn.Linear`` (or GPT-2's ``Conv1D``) except those ``get_modules_to_not_convert`` names
    (``llm_int8_skip_modules``, or by default the output embedding, tied weights and the last module; plus the
    model's ``_keep_in_fp32_modules``), matched by ``should_convert_module``. Only the weight is quantized (a bias
    stays a plain parameter). Called on the base model, before peft wraps it: the same parameter objects stay in
    the peft model's ``base_layer``.
    """
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(skip_modules) if skip_modules is not None else None
    keep = getattr(model, "_keep_in_fp32_modules", None)
    not_convert = HfQuantizer.get_modules_to_not_convert(model, skip, list(keep) if keep else None)
    return {
        id(module.weight)
        for name, module in model.named_modules()
        if (type(module) is nn.Linear or isinstance(module, Conv1D)) and should_convert_module(name, not_convert)
    }


def config_fields(config_object: Any) -> dict[str, int]:
    """Shapes the estimator's logits workspace and reports use, read through transformers' config classes."""

    def number(name: str) -> int:
        value = config_value(config_object, name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    heads = number("num_attention_heads")
    hidden = number("hidden_size")
    return {
        "vocab_size": number("vocab_size"),
        "hidden_size": hidden,
        "num_layers": number("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": number("num_key_value_heads") or heads,
        "head_dim": number("head_dim") or (hidden // heads if heads else 0),
        "intermediate_size": number("intermediate_size"),
        "max_positions": number("max_position_embeddings"),
    }
