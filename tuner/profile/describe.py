"""A model described from its config: its :class:`~tuner.workload.ModelSpec` and :class:`~tuner.workload.ModelProfile`
(parameters, traced activations), read from the disk cache, or computed (importing torch and transformers) on a miss.

On a cache hit nothing heavy is imported: ``dstune estimate`` on a cached model stays fast. Bad configs raise
:class:`~tuner.workload.WorkloadError` naming the field, and nothing is cached for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from tuner.profile.cache import ProfileCache, activation_key, canonical_config, params_key
from tuner.profile.config_checks import refuse_custom_code, transformers_version
from tuner.workload import (
    SUPPORTED_FAMILIES,
    ModelProfile,
    ModelSpec,
    TrainableSpec,
    Workload,
    WorkloadError,
    load_hf_config,
    model_from_hf_config,
)


def params_profile(
    config: dict[str, Any], cache: ProfileCache | None = None, trainable: TrainableSpec | None = None
) -> ModelProfile:
    """The parameter facts of a config's model (no activations), cached; with a non-full ``trainable``, of the
    model as trained (the peft model, :func:`tuner.profile.hf.describe_trained`)."""
    config = refuse_custom_code(config)
    cache = cache or ProfileCache()
    full = trainable is None or trainable.is_full
    key = params_key(config, transformers_version(), None if full else trainable)
    found = cache.get_params(key)
    if found is None:
        if full or trainable is None:
            from tuner.profile.hf import describe

            found = describe(config)
        else:
            from tuner.profile.hf import describe_trained

            found = describe_trained(config, trainable)
        cache.put_params(key, found)
    return found


def adapter_variants(profile: ModelProfile) -> tuple[str, ...]:
    """The variants of the model as trained that activations are traced in: as ZeRO 0-2 train it (``""``: the
    adapters cast to the training dtype) and as ZeRO-3 does (``zero3``: peft's fp32 adapters kept, every Linear
    saving its input: :func:`tuner.profile.trace.trace_activations`). A fully trained model is traced once."""
    return ("",) if profile.is_full else ("", "zero3")


def experts_key(config: dict[str, Any]) -> str:
    """The MoE experts implementation asked for (``default``: transformers' choice for the installed version)."""
    return str(config.get("experts_implementation") or "default")


def _traceable(profile: ModelProfile, checkpointing: Iterable[bool]) -> tuple[bool, ...]:
    """The checkpointing settings to trace: with checkpointing only where transformers can checkpoint the model
    (a workload that asks for it is refused by :func:`with_profile`)."""
    return tuple(ckpt for ckpt in checkpointing if profile.supports_checkpointing or not ckpt)


def model_profile(
    config: dict[str, Any],
    seq_len: int,
    precision: str,
    attention: str | None,
    checkpointing: Iterable[bool] = (False, True),
    cache: ProfileCache | None = None,
    trainable: TrainableSpec | None = None,
) -> ModelProfile:
    """The model's profile with activations traced for ``seq_len``, ``precision``, ``attention`` (None: the one
    transformers resolves, ``profile.attention``) and each checkpointing setting; every part read from the cache or
    traced and cached. A non-full ``trainable``: the profile of the model as trained, traced as ZeRO 0-2 and as
    ZeRO-3 train it (:func:`adapter_variants`)."""
    return lengths_profile(config, (seq_len,), precision, attention, checkpointing, cache, trainable)


def lengths_profile(
    config: dict[str, Any],
    seq_lens: Iterable[int],
    precision: str,
    attention: str | None,
    checkpointing: Iterable[bool] = (False, True),
    cache: ProfileCache | None = None,
    trainable: TrainableSpec | None = None,
) -> ModelProfile:
    """:func:`model_profile` at each of ``seq_lens`` (one profile holding every length's activations): the lengths
    missing from the cache are traced together, each checkpointing setting's copy of the model built once."""
    cache = cache or ProfileCache()
    profile = params_profile(config, cache, trainable)
    attention = attention or profile.attention
    checkpointing, version = tuple(checkpointing), transformers_version()
    keys = {
        (length, setting): key
        for length in dict.fromkeys(seq_lens)
        for setting, key in _activation_keys(
            config, version, length, precision, attention, profile, checkpointing, trainable
        ).items()
    }
    found = {at: cache.get_activation(key) for at, key in keys.items()}
    for adapters in adapter_variants(profile):
        missing = [
            (length, ckpt)
            for (length, (ckpt, variant)), entry in found.items()
            if variant == adapters and entry is None
        ]
        if missing:
            from tuner.profile.trace import trace_lengths

            traced = trace_lengths(
                config, profile.layer_kinds, {n for n, _ in missing}, precision, attention,
                {ckpt for _, ckpt in missing}, trainable, adapters,
            )  # fmt: skip
            for length, entries in traced.items():
                for ckpt, entry in entries.items():
                    cache.put_activation(keys[length, (ckpt, adapters)], entry)
                    found[length, (ckpt, adapters)] = entry
    return profile.with_activations(tuple(entry for entry in found.values() if entry is not None))


def _activation_keys(
    config: dict[str, Any],
    version: str,
    seq_len: int,
    precision: str,
    attention: str,
    profile: ModelProfile,
    checkpointing: Iterable[bool],
    trainable: TrainableSpec | None,
) -> dict[tuple[bool, str], str]:
    """The cache key of each activation profile of one precision, by (checkpointing, adapters), in profile order."""
    return {
        (ckpt, adapters): activation_key(
            config, version, seq_len, precision, attention, experts_key(config), ckpt, trainable, adapters
        )
        for ckpt in _traceable(profile, checkpointing)
        for adapters in adapter_variants(profile)
    }


def cached_profile(
    config: dict[str, Any],
    seq_len: int,
    precisions: Iterable[str],
    attention: str | None,
    checkpointing: Iterable[bool] = (False, True),
    cache: ProfileCache | None = None,
    trainable: TrainableSpec | None = None,
) -> ModelProfile | None:
    """The profile :func:`model_profile` would give for each of ``precisions``, if every part is cached; else None.
    Reads files only: never imports torch."""
    config = refuse_custom_code(config)
    cache = cache or ProfileCache()
    version_ = transformers_version()
    profile = cache.get_params(params_key(config, version_, trainable))
    if profile is None:
        return None
    attention = attention or profile.attention
    entries = []
    for precision in precisions:
        for key in _activation_keys(
            config, version_, seq_len, precision, attention, profile, checkpointing, trainable
        ).values():
            entry = cache.get_activation(key)
            if entry is None:
                return None
            entries.append(entry)
    return profile.with_activations(tuple(entries))


def model_from_config(
    config: dict[str, Any],
    name: str = "custom",
    implementation: str = "transformers",
    cache: ProfileCache | None = None,
) -> ModelSpec:
    """A :class:`ModelSpec` for any causal LM config transformers can build, parameters counted on ``meta``.

    ``implementation="builtin"``: dstune's own model of a gpt2, llama, mistral, qwen2 or gpt_neox config, described
    by :func:`tuner.workload.model_from_hf_config` (pure Python; as stored before profiles existed).
    """
    if implementation == "builtin":
        refuse_custom_code(config)
        if config["model_type"] not in SUPPORTED_FAMILIES:
            raise WorkloadError(
                "model-impl", f"the built-in models cover {', '.join(SUPPORTED_FAMILIES)}, not {config['model_type']}"
            )
        return model_from_hf_config(config, name=name)
    return spec_from_profile(config, params_profile(config, cache), name)


def spec_from_profile(config: dict[str, Any], profile: ModelProfile, name: str = "custom") -> ModelSpec:
    """The :class:`ModelSpec` of the transformers model of a config whose parameter facts are ``profile``."""
    dims = profile.dims
    return ModelSpec(
        name=name,
        family=profile.model_type,
        vocab_size=dims.get("vocab_size", 0),
        hidden_size=dims.get("hidden_size", 0),
        num_layers=profile.n_layers,
        num_heads=dims.get("num_heads", 0),
        num_kv_heads=dims.get("num_kv_heads", 0),
        head_dim=dims.get("head_dim", 0),
        intermediate_size=dims.get("intermediate_size", 0),
        max_positions=dims.get("max_positions", 0),
        tie_embeddings=profile.tied_embeddings,
        architecture=profile.architecture,
        implementation="transformers",
        hf_config=canonical_config(config),
        numels=profile.param_numels,
        position_table=dims.get("position_table", 0),
    )


def load_model(source: str, implementation: str = "transformers", cache: ProfileCache | None = None) -> ModelSpec:
    """A model from a preset name or a ``config.json`` path (or folder), for any architecture transformers ships:
    the transformers model (``implementation="transformers"``, its parameters counted on the meta device) or
    dstune's built-in one of the same config (``"builtin"``: :func:`tuner.workload.load_builtin_model`, five
    families)."""
    config, name = load_hf_config(source)
    return model_from_config(config, name=name, implementation=implementation, cache=cache)


def with_profile(
    workload: Workload,
    precisions: Iterable[str] | None = None,
    checkpointing: Iterable[bool] = (False, True),
    cache: ProfileCache | None = None,
    activation_checkpointing: bool = False,
    lengths: Iterable[int] = (),
) -> Workload:
    """The workload carrying its model's profile, traced for its sequence length (and ``lengths``, traced together
    with it: :func:`lengths_profile`) and attention, each of
    ``precisions`` (default: the workload's) and checkpointing setting; for a workload with an adapter or frozen
    parameters, the profile of the model as trained. Built-in and bare models are returned as they are (their
    activations are formulas, or unknown; a trainable part needs a transformers model: refused naming ``peft``
    or ``freeze``). ``activation_checkpointing``: the trial will checkpoint (refused, naming
    ``activation-checkpointing``, for a class transformers cannot checkpoint)."""
    model = workload.model
    if model.implementation != "transformers" or not model.hf_config:
        if not workload.trainable.is_full:
            field = "peft" if workload.trainable.peft else "freeze"
            raise WorkloadError(field, "needs a transformers model config (--model), not a bare count or built-in")
        return workload
    config = json.loads(model.hf_config)
    train, checkpointing = workload.train, tuple(checkpointing)
    if activation_checkpointing and not params_profile(config, cache).supports_checkpointing:
        raise WorkloadError(
            "activation-checkpointing", f"{model.architecture} has no activation checkpointing in transformers"
        )
    profile: ModelProfile | None = None
    seq_lens = sorted({train.seq_len, *lengths})
    for precision in precisions or (train.precision,):
        traced = lengths_profile(config, seq_lens, precision, train.attention, checkpointing, cache, workload.trainable)
        profile = traced if profile is None else profile.with_activations(traced.activations)
    return replace(workload, profile=profile)
