"""What a whole model really saves in one forward pass on CPU (real tensors, random weights): the reference the
traced profile is checked against by the profile tests and the accuracy bench (imports torch and transformers)."""

from __future__ import annotations

from typing import Any

import torch

from tuner.profile.autograd_saved import saved_bytes_by_layer
from tuner.profile.hf import TORCH_DTYPES, build, enable_checkpointing, quiet


def measured_saved_bytes(
    config: dict[str, Any], micro_batch: int, seq_len: int, precision: str, attention: str | None, checkpointing: bool
) -> int:
    """Bytes the whole model really saves in one forward pass on CPU (real tensors, random weights): the reference
    the traced profile is checked against."""
    torch.manual_seed(0)
    with quiet():
        model = build(config, attention=attention, dtype=TORCH_DTYPES[precision])
    if checkpointing:
        enable_checkpointing(model)
    with quiet():
        return sum(saved_bytes_by_layer(model, micro_batch, seq_len).values())
