"""A fake-tensor copy of a transformers model holding only the first two layers of each layer kind
(:func:`build_copy`): what :mod:`tuner.profile.trace` runs its forward passes on. Imports torch and transformers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tuner.profile.hf import TORCH_DTYPES, build, enable_checkpointing, hf_config
from tuner.profile.model_parts import (
    config_value,
    decoder_layers,
    depth_field,
    layer_kinds,
    replace_module,
    text_config,
)
from tuner.workload import TrainableSpec, WorkloadError
from tuner.workload.autocast import split_trace_precision


def _representatives(kinds: tuple[str, ...] | list[str]) -> list[int]:
    """Indices of the first two layers of each kind (one where the model has only one), in model order."""
    seen: dict[str, list[int]] = {}
    for index, kind in enumerate(kinds):
        if len(seen.setdefault(kind, [])) < 2:
            seen[kind].append(index)
    return sorted(index for indices in seen.values() for index in indices)


def build_copy(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    precision: str,
    attention: str,
    checkpointing: bool,
    trainable: TrainableSpec | None = None,
    adapters: str = "",
    whole: bool = False,
    real: bool = False,
) -> tuple[nn.Module, list[int], FakeTensorMode | None]:
    """A fake-tensor copy of the model keeping only the representative layers; returns it with their indices.
    ``whole``: every layer kept (a model whose forward pass cannot run on fewer layers than it was built with).

    ``trainable`` (not full): the copy is the model as trained, the adapter added by peft after checkpointing is
    enabled (as a training script does) and the freeze pattern applied (:mod:`tuner.profile.trainable`; a pattern
    naming only layers the copy lacks freezes nothing here). ``adapters=""`` casts every parameter to the training
    dtype, as DeepSpeed's engine does under ZeRO 0-2; ``fp32`` and ``zero3`` keep peft's fp32 adapters (ZeRO-3)."""
    keep = list(range(len(kinds))) if whole else _representatives(kinds)
    fake_mode = None if real else FakeTensorMode(allow_non_fake_inputs=True)
    adapted = trainable is not None and not trainable.is_full
    model, built = _shortest(config, kinds, keep[-1] + 1, precision, attention, fake_mode, adapted)
    layers = decoder_layers(model)
    kept = nn.ModuleList([layers[i] for i in keep])
    replace_module(model, layers, kept)
    text = text_config(model.config)
    if len(keep) < len(layers):
        field = depth_field(text, len(layers))
        _renumber(kept, keep)
        _subset_per_layer(text, keep, built)
        _set_depth(text, field, len(keep))
    if checkpointing:
        enable_checkpointing(model)
    if adapted and trainable is not None:
        from tuner.profile.trainable import apply_trainable

        model = apply_trainable(model, trainable, strict=False)
        if not adapters:  # DeepSpeed's engine casts every parameter to the training dtype (ZeRO 0-2)
            model.to(TORCH_DTYPES[split_trace_precision(precision)[0]])
        if fake_mode is None:
            raise WorkloadError("model.model_type", "a model as trained (peft, frozen) is traced on fake tensors only")
        with fake_mode:
            model.to_empty(device="cpu")
    return model, keep, fake_mode


def _shortest(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    built: int,
    precision: str,
    attention: str,
    fake_mode: FakeTensorMode | None,
    adapted: bool,
) -> tuple[Any, int]:
    """The model with its first ``built`` layers (``num_hidden_layers`` and the per-layer lists cut), when
    transformers builds that shorter config into the same layers as the full model's first ``built`` (the same
    kinds); else the whole model (a config whose other fields count or describe layers too: Gemma-3n's shared-KV
    layers, Dory's input and output layers, ProphetNet's decoder layers...), returned with its layer count."""
    if built < len(kinds):
        full = text_config(hf_config(config))
        field = depth_field(full, len(kinds))
        overrides: dict[str, Any] = {field: built}
        for name, value in config.items():  # per-layer lists (layer_types...) follow the shorter model
            if isinstance(value, list) and len(value) == config_value(full, field) and name != "architectures":
                overrides[name] = value[:built]
        try:
            model = _construct(config, precision, attention, fake_mode, adapted, overrides)
        except WorkloadError:  # the shorter config is not one transformers takes: the whole model below
            model = None
        if model is not None and layer_kinds(model) == list(kinds[:built]):
            return model, built
    return _construct(config, precision, attention, fake_mode, adapted, {}), len(kinds)


def _construct(
    config: dict[str, Any],
    precision: str,
    attention: str,
    fake_mode: FakeTensorMode | None,
    adapted: bool,
    overrides: dict[str, Any],
) -> Any:
    """The model under fake tensors (on ``meta`` for an adapter: peft builds its layers there). Where building
    under fake tensors fails (initialisation reads a tensor's value; a module converted with ``.to()`` while
    constructed cannot swap a fake parameter: DeepSeek-V4's, HY-V4's hyper-connections), it is built on ``meta``
    and given fake CPU storage; an error there is transformers' own."""
    dtype = TORCH_DTYPES[split_trace_precision(precision)[0]]  # under autocast: the parameters' own dtype
    if fake_mode is None:  # real CPU tensors, random weights (build_copy refuses an adapter here)
        return build(config, attention=attention, dtype=dtype, **overrides)
    if not adapted:
        try:
            with fake_mode:
                return build(config, attention=attention, dtype=dtype, **overrides)
        except WorkloadError as error:
            if "cannot build" not in str(error):
                raise
    with torch.device("meta"):
        model = build(config, attention=attention, dtype=dtype, **overrides)
    if not adapted:
        with fake_mode:
            model.to_empty(device="cpu")
    return model


def _set_depth(config: Any, field: str, layers: int) -> None:
    """The copy's config says (in ``field``, :func:`depth_field`) it holds ``layers`` layers; where that is a
    property that cannot be set (ProphetNet's ``num_hidden_layers``: its depth is ``num_decoder_layers``), a
    subclass answers it."""
    try:
        setattr(config, field, layers)
    except (AttributeError, NotImplementedError):
        config.__class__ = type(type(config).__name__, (type(config),), {field: layers})


def _renumber(kept: nn.ModuleList, keep: list[int]) -> None:
    """Each kept layer's modules take its new position as their layer index (caches are indexed by it)."""
    for position, index in enumerate(keep):
        for module in kept[position].modules():
            for attribute in ("layer_idx", "layer_id"):
                if getattr(module, attribute, None) == index and not isinstance(getattr(module, attribute), bool):
                    setattr(module, attribute, position)


def _subset_per_layer(config: Any, keep: list[int], built: int) -> None:
    """Per-layer lists of the config (``layer_types``...) follow the kept layers; lists of layer indices stay."""
    for name, value in list(vars(config).items()):
        if not isinstance(value, (list, tuple)) or len(value) != built or name == "architectures":
            continue
        if all(isinstance(item, int) for item in value) and list(value) == sorted(set(value)):
            continue  # indices of layers (mlp_only_layers...), read when the layers were built
        setattr(config, name, type(value)(value[i] for i in keep))
    derived = {}  # per-layer lists a property computes (Jamba's layers_block_type from periods and offsets)
    for name in dir(type(config)):
        if isinstance(getattr(type(config), name, None), property):
            try:
                value = getattr(config, name)
            except Exception:  # a property this config cannot answer
                continue
            if isinstance(value, (list, tuple)) and len(value) == built:
                derived[name] = type(value)(value[i] for i in keep)
    if derived:
        config.__class__ = type(type(config).__name__, (type(config),), derived)
