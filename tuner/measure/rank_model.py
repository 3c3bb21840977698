"""The model a rank trains: built where it trains (:mod:`tuner.measure.birth`), the built-in one or the transformers
one, with its trainable part applied as the HF Trainer gets it (a peft adapter, frozen patterns)."""

from __future__ import annotations

import json
from typing import Any

from tuner.measure.measurement import RankResult
from tuner.measure.run_protocol import RunSpec
from tuner.workload import TrainableSpec, Workload


def trained_model(spec: RunSpec, workload: Workload, result: RankResult) -> Any:
    """Build the model sharded (ZeRO-3) or on the device in the training dtype (``tuner.measure.birth``),
    recording the resident bytes it added on the host in ``result``, then make its trainable part
    (:func:`_with_trainable`)."""
    from tuner.measure.birth import born_on_device, initialise_partitioned, rss_bytes

    rss = result.rss_bytes
    rss["before_model"] = rss_bytes()
    transformers = workload.model.implementation == "transformers"
    if not workload.trainable.is_full and not transformers:
        field = "peft" if workload.trainable.peft else "freeze"
        raise ValueError(f"{field}: needs the transformers model (model_impl transformers), not the built-in one")
    with born_on_device(spec.ds_config, spec.device, transformers):
        model = _build_model(workload, spec.activation_checkpointing)
    initialise_partitioned(model)  # the base model's weights, before the adapter is added (lora_B stays zero)
    model = _with_trainable(model, workload.trainable, result)
    rss["after_model"] = rss_bytes()
    return model


def _with_trainable(model: Any, trainable: TrainableSpec, result: RankResult) -> Any:
    """The transformers model with its adapter added and its freeze pattern applied (``apply_trainable``), as
    the HF Trainer gets it: after the base model is built, outside ``zero.Init``. Under ZeRO-3 the adapter's
    parameters are then ordinary tensors until ``deepspeed.initialize`` partitions them (DeepSpeedZeRoOffload
    converts every parameter without a ``ds_id``; peft keeps them fp32, which ZeRO-3 leaves as is while ZeRO-0-2
    cast the whole module to the training dtype). Records how many parameters train (``ds_numel``: ZeRO-3's
    parameters are empty until gathered)."""
    if trainable.is_full:
        return model
    from tuner.profile.trainable import apply_trainable

    model.model = apply_trainable(model.model, trainable)
    params = list(model.parameters())
    result.trainable_params = sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)
    return model


def _build_model(workload: Workload, checkpointing: bool) -> Any:
    """The model as ``workload`` names it (not yet trainable-filtered), in the current device and dtype context."""
    train = workload.train
    if workload.model.implementation == "transformers":
        from tuner.measure.models import build_transformers_model

        return build_transformers_model(json.loads(workload.model.hf_config), train.attention, checkpointing)
    from tuner.measure.models import build_model

    return build_model(workload.model, attention=train.attention, checkpointing=checkpointing)
