"""A trial's parameter values written into a ds_config: the space's ``base`` sections, the workload's precision and
optimizer, each active parameter at its dotted key, NVMe paths on NVMe offload sections.

The batch sizes and the global batch are not written here: :meth:`tuner.workload.TrialConfig.with_batch` adds
them (over the layout's data-parallel ranks).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.space.parameters import Parameter
from tuner.workload import BATCH_KEYS, OFFLOAD_OPTIMIZER_KEYS, OFFLOAD_PARAM_KEYS, TrainSpec

OPTIMIZER_TYPES = {"adam": "Adam", "adamw": "AdamW"}
OFFLOAD_SECTIONS = {"offload_optimizer": OFFLOAD_OPTIMIZER_KEYS, "offload_param": OFFLOAD_PARAM_KEYS}


def assemble(
    base: Mapping[str, Any],
    parameters: Sequence[Parameter],
    values: Mapping[str, Any],
    train: TrainSpec,
    nvme_path: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """The ds_config of ``values`` (active parameters only) over ``base``, and whether it checkpoints activations."""
    config = copy.deepcopy(dict(base))
    precision_extra = config.pop(train.precision, None) if train.precision in ("bf16", "fp16") else None
    config.pop("bf16", None)
    config.pop("fp16", None)
    if train.precision in ("bf16", "fp16"):
        config[train.precision] = {**(precision_extra or {}), "enabled": True}
    optimizer = config.get("optimizer")
    if isinstance(optimizer, dict) and "type" not in optimizer:
        optimizer["type"] = OPTIMIZER_TYPES[train.optimizer]
    checkpointing = False
    for parameter in parameters:
        value = values.get(parameter.name)
        if parameter.name not in values or value is None:
            continue
        if parameter.train == "activation_checkpointing":
            checkpointing = bool(value)
        elif parameter.key and parameter.key not in BATCH_KEYS:
            _set_path(config, parameter.key, value)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict) and nvme_path:
        for section in OFFLOAD_SECTIONS:
            if isinstance(zero.get(section), dict) and zero[section].get("device") == "nvme":
                zero[section]["nvme_path"] = nvme_path
    return config, checkpointing


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


__all__ = ["OFFLOAD_SECTIONS", "OPTIMIZER_TYPES", "assemble"]
