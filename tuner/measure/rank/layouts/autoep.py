"""AutoEP expert parallelism on a rank: the model handed to ``deepspeed.initialize`` so that DeepSpeed finds the MoE
blocks of the transformers model inside the runner's wrapper, and the shim that lets its presets run with
transformers 5.24.

DeepSpeed 0.19.8 applies AutoEP inside ``deepspeed.initialize`` when ``expert_parallel.enabled`` with
``autoep_size`` > 1 (``DeepSpeedEngine._configure_expert_parallel``). It picks the preset from the module's
``config.model_type`` (``auto_ep_presets/registry.py`` ``resolve_preset_candidates``) and replaces each module whose
*full* name matches the preset's ``moe_layer_pattern`` (``model\\.layers\\.\\d+\\.mlp``; ``auto_ep.py`` ``ep_parser``
uses ``fullmatch``). The runner trains a :class:`~tuner.measure.rank.models.TransformersCausalLM` wrapper: it has no
``config`` and its blocks are named ``model.model.layers.N.mlp``, so DeepSpeed would find nothing and train without
experts sharded, silently. :func:`expose_moe_layers` gives the wrapper the inner model's config and returns the
pattern with the wrapper's prefix, which the ds_config handed to DeepSpeed carries (``moe_layer_pattern`` overrides
the preset's, ``apply_config_overrides``); the exported config keeps the preset's own.
"""

from __future__ import annotations

from typing import Any

from tuner.workload import Ranks, TrialConfig, Workload
from tuner.workload.layouts import AUTOEP

# every preset's MoE block in DeepSpeed 0.19.8's AutoEP (auto_ep_presets/*.py moe_layer_pattern): model.layers.N.mlp
PRESET_PATTERN = r"model\.layers\.\d+\.mlp"
AUTOEP_BUILT_IN = "needs the transformers model (model_impl transformers): DeepSpeed's AutoEP replaces its MoE blocks"
AUTOEP_PEFT = "AutoEP under a peft adapter or a freeze pattern is not measured (the estimator does not model it)"
AUTOEP_CUDA = "needs CUDA (DeepSpeed's AutoEP runs it on CUDA tensors only): not measured on CPU ranks"


def refusal(workload: Workload, trial: TrialConfig, device: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a run cannot apply ``trial``'s AutoEP on ``device``: on the built-in model, under a
    peft adapter or a freeze pattern (not modelled), or a CUDA-only path on CPU ranks; else None."""
    if trial.layout.degree(AUTOEP) <= 1:
        return None
    expert = trial.ds_config.get("expert_parallel") or {}
    if workload.model.implementation != "transformers":
        return AUTOEP.key, AUTOEP_BUILT_IN
    if not workload.trainable.is_full:
        return AUTOEP.key, AUTOEP_PEFT
    if device != "cuda" and expert.get("comm_backend", "comm") != "comm":
        return "expert_parallel.comm_backend", AUTOEP_CUDA
    if device != "cuda" and expert.get("async_split_plan"):
        return "expert_parallel.async_split_plan", AUTOEP_CUDA
    return None


def registry_shim() -> bool:
    """Let transformers' output-capture registry take the dict calls DeepSpeed's AutoEP makes on it; True if patched.

    Versions: DeepSpeed 0.19.8 with transformers 5.24.0. The error it works around, raised inside
    ``deepspeed.initialize`` on every device for the Mixtral, Qwen2-MoE/Qwen3-MoE (and, read from the source,
    Qwen3.5-MoE and MiniMax-M3) presets::

        TypeError: _CanRecordRegistry.get() takes 2 positional arguments but 3 were given
        at deepspeed/module_inject/auto_ep_presets/base.py:326:
            registry_key: registry.get(registry_key, _MISSING_REGISTRY_ENTRY)

    transformers 5.24 made ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY`` a ``dict`` subclass whose
    ``get(model)`` and ``__setitem__(model, value)`` take a model and key on ``str(model.__class__)``; AutoEP's
    router-logit retargeting already passes that string, calls ``get(key, default)`` and restores entries by key.
    The patch accepts a string key as it is and a default, and leaves transformers' own calls (with a model) as they
    were. DeepSeek-V2/V3 presets never touch the registry. Measured: with it, Qwen2-MoE and Mixtral train with
    AutoEP = 2 on 2 gloo ranks with step-0 loss and gradient norm equal to one rank's
    (``bench/results/autoep_check.md``).
    """
    try:
        from transformers.utils.output_capturing import _CanRecordRegistry
    except ImportError:  # another transformers: nothing to patch
        return False
    if getattr(_CanRecordRegistry, "_dstune_shim", False):
        return True
    missing = object()

    def key_of(model: Any) -> str:
        return model if isinstance(model, str) else str(model.__class__)

    def get(self: dict, model: Any, default: Any = missing) -> Any:
        if default is missing:
            return dict.get(self, key_of(model)) or {}
        return dict.get(self, key_of(model), default)

    def setitem(self: dict, model: Any, value: Any) -> None:
        dict.__setitem__(self, key_of(model), value)

    _CanRecordRegistry.get = get  # type: ignore[method-assign]
    _CanRecordRegistry.__setitem__ = setitem  # type: ignore[method-assign]
    _CanRecordRegistry._dstune_shim = True  # type: ignore[attr-defined]
    return True


def expose_moe_layers(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The ds_config ``config`` for ``model`` (the module DeepSpeed is handed): the transformers model inside it
    found (the first module with a ``config.model_type``), its ``config`` set on ``model``, and
    ``expert_parallel.moe_layer_pattern`` prefixed with where it sits in ``model``, unless the config names its own
    pattern. ``config`` itself is not changed; the registry shim is applied (:func:`registry_shim`).

    Raises:
        ValueError: no transformers model inside ``model``.
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(getattr(module, "config", None), "model_type")
    ]
    if not found:
        raise ValueError("expert_parallel.autoep_size: AutoEP needs the transformers model (model_impl transformers)")
    prefix, inner = found[0]
    registry_shim()
    model.config = inner.config
    expert = dict(config.get("expert_parallel") or {})
    if prefix and "moe_layer_pattern" not in expert:
        expert["moe_layer_pattern"] = prefix.replace(".", r"\.") + r"\." + PRESET_PATTERN
    return {**config, "expert_parallel": expert}


def place(ranks: Ranks, rank: int) -> dict[str, int]:
    """The rank's expert-parallel size and rank and its expert-data-parallel group size, as DeepSpeed groups them
    (``groups._create_expert_and_data_parallel`` without AutoTP: ``ep`` consecutive ranks share the experts).

    >>> place(Ranks(4, expert=2), 3)
    {'expert_parallel': 2, 'ep_rank': 1}
    """
    return {"expert_parallel": ranks.expert, "ep_rank": ranks.place(rank).expert_parallel}


__all__ = [
    "AUTOEP_BUILT_IN",
    "AUTOEP_CUDA",
    "AUTOEP_PEFT",
    "PRESET_PATTERN",
    "expose_moe_layers",
    "place",
    "refusal",
    "registry_shim",
]
