"""A trial's long-context settings: the Arctic Long Sequence Training (ALST) pieces beside Ulysses.

Ulysses' degree itself is part of the :class:`~tuner.workload.layout.ParallelLayout` (``sequence_parallel_size``).
What ALST adds around it is applied by dstune to the model, not read by DeepSpeed, so it lives in the trial's
``dstune`` section:

- ``tiled_mlp_shards``: DeepSpeed's ``TiledMLP`` around each decoder layer's MLP, computing it in this many
  sequence shards (1: off);
- ``tiled_loss_shards``: logits and loss computed in this many shards by ``TiledFusedLogitsLoss``, the full logits
  never materialized (1: off);
- ``offload_checkpoints``: the checkpointed layer inputs kept in host memory (ALST's checkpoint offload; needs
  activation checkpointing).

DeepSpeed's own ``seq_parallel_communication_data_type`` (top level) is read here too: the dtype Ulysses reduces
gradients in. DeepSpeed 0.19.8 reduces them in fp32 whatever it says (a leftover line overrides the default), so
:attr:`LongContext.communication_dtype` is what it really uses.

Example:
    >>> ctx = LongContext.of({"dstune": {"tiled_mlp_shards": 4, "offload_checkpoints": True}})
    >>> ctx.tiled_mlp_shards, ctx.tiled_loss_shards, ctx.summary()
    (4, 1, 'tiled MLP 4 · checkpoints → cpu')
    >>> LongContext.of({"dstune": {"tiled_loss_shards": 0}})
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: dstune.tiled_loss_shards: must be >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.workload.config_values import ConfigError, read_bool, read_int, section

SETTINGS_SECTION = "dstune"
COMM_DTYPE_KEY = "seq_parallel_communication_data_type"
COMM_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True, slots=True)
class LongContext:
    """ALST's tiling and checkpoint offload, and Ulysses' gradient communication dtype."""

    tiled_mlp_shards: int = 1
    tiled_loss_shards: int = 1
    offload_checkpoints: bool = False
    requested_communication_dtype: str = "fp32"

    @classmethod
    def of(cls, ds_config: Mapping[str, Any]) -> LongContext:
        """Read the settings out of a ds_config.

        Raises:
            ConfigError: a bad value, naming its dotted key.
        """
        settings = section(ds_config, SETTINGS_SECTION)
        prefix = f"{SETTINGS_SECTION}."
        raw_dtype = ds_config.get(COMM_DTYPE_KEY, "fp32")
        dtype = COMM_DTYPES.get(raw_dtype) if isinstance(raw_dtype, str) else None
        if dtype is None:
            raise ConfigError(COMM_DTYPE_KEY, f"must be one of {sorted(set(COMM_DTYPES))}, got {raw_dtype!r}")
        return cls(
            tiled_mlp_shards=read_int(settings, "tiled_mlp_shards", 1, prefix, minimum=1),
            tiled_loss_shards=read_int(settings, "tiled_loss_shards", 1, prefix, minimum=1),
            offload_checkpoints=read_bool(settings, "offload_checkpoints", False, prefix),
            requested_communication_dtype=dtype,
        )

    @property
    def communication_dtype(self) -> str:
        """The dtype DeepSpeed 0.19.8 really reduces Ulysses' gradients in: fp32 whatever the config asks."""
        return "fp32"

    @property
    def any(self) -> bool:
        """Whether any ALST piece is on."""
        return self.tiled_mlp_shards > 1 or self.tiled_loss_shards > 1 or self.offload_checkpoints

    def summary(self) -> str:
        """``tiled MLP 4 · tiled loss 8 · checkpoints → cpu`` for the pieces that are on (empty when none)."""
        parts = []
        if self.tiled_mlp_shards > 1:
            parts.append(f"tiled MLP {self.tiled_mlp_shards}")
        if self.tiled_loss_shards > 1:
            parts.append(f"tiled loss {self.tiled_loss_shards}")
        if self.offload_checkpoints:
            parts.append("checkpoints → cpu")
        return " · ".join(parts)


def long_context_config(
    sp: int = 1, tiled_mlp_shards: int = 1, tiled_loss_shards: int = 1, offload_checkpoints: bool = False
) -> dict[str, Any]:
    """The ds_config keys that say these settings (only those off their defaults), as :class:`LongContext` and
    :class:`~tuner.workload.layout.ParallelLayout` read them: what the CLI flags and the API fields write.

    >>> long_context_config(2, tiled_loss_shards=8)
    {'sequence_parallel_size': 2, 'dstune': {'tiled_loss_shards': 8}}
    """
    config: dict[str, Any] = {}
    if sp != 1:
        config["sequence_parallel_size"] = sp
    settings: dict[str, Any] = {}
    if tiled_mlp_shards != 1:
        settings["tiled_mlp_shards"] = tiled_mlp_shards
    if tiled_loss_shards != 1:
        settings["tiled_loss_shards"] = tiled_loss_shards
    if offload_checkpoints:
        settings["offload_checkpoints"] = True
    if settings:
        config[SETTINGS_SECTION] = settings
    return config


__all__ = ["COMM_DTYPE_KEY", "LongContext", "long_context_config"]
