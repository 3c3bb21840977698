"""DeepSpeed's ``torch_autocast`` section: the model's forward pass runs under ``torch.autocast`` (the engine's
``autocast_if_enabled``, DeepSpeed 0.19.8), which changes what the layers save for backward (16-bit inputs of the
matrix multiplications, fp32 outputs of the norms and softmaxes on CUDA), not the model states.

Activation profiles are keyed by a *trace precision*: the training precision alone, or with the autocast dtype and
the device whose autocast policy the trace follows (:func:`trace_precision`), e.g. ``"bf16+autocast:cuda:bf16"``.

Example:
    >>> autocast_dtype({"torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"}}, "cuda")
    'bf16'
    >>> trace_precision("bf16", "bf16", "cuda"), split_trace_precision("bf16+autocast:cuda:bf16")
    ('bf16+autocast:cuda:bf16', ('bf16', 'cuda', 'bf16'))
    >>> trace_precision("bf16", "", "cuda"), split_trace_precision("fp32")
    ('bf16', ('fp32', '', ''))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.workload.config_values import ConfigError, read_bool, section

KEY = "torch_autocast"
# DeepSpeed's DtypeEnum spellings of the dtypes autocast lowers to (runtime/config.py)
DTYPE_NAMES = {
    "torch.bfloat16": "bf16", "bf16": "bf16", "bfloat16": "bf16",
    "torch.float16": "fp16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
}  # fmt: skip
DEVICE_DEFAULT = {"cuda": "fp16", "cpu": "bf16"}  # torch.autocast's dtype when DeepSpeed is given none
MARK = "+autocast:"


def autocast_dtype(ds_config: Mapping[str, Any], device: str) -> str:
    """The dtype (``bf16``, ``fp16``) the forward pass autocasts to under ``ds_config`` on ``device``, or ``""``
    without ``torch_autocast.enabled``; a dtype DeepSpeed does not take is refused naming ``torch_autocast.dtype``."""
    config = section(ds_config, KEY)
    if not read_bool(config, "enabled", False, f"{KEY}."):
        return ""
    dtype = config.get("dtype")
    if dtype is None:
        return DEVICE_DEFAULT.get(device, "bf16")
    if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:
        raise ConfigError(f"{KEY}.dtype", f"must be torch.bfloat16 or torch.float16, got {dtype!r}")
    return DTYPE_NAMES[dtype]


def trace_precision(precision: str, autocast: str, device: str) -> str:
    """The key of the activations traced for ``precision`` under ``autocast`` (``""``: none) with ``device``'s
    autocast policy."""
    return f"{precision}{MARK}{device}:{autocast}" if autocast else precision


def split_trace_precision(key: str) -> tuple[str, str, str]:
    """(training precision, autocast device, autocast dtype) of a trace precision; the last two ``""`` without."""
    precision, _, rest = key.partition(MARK)
    device, _, dtype = rest.partition(":")
    return precision, device, dtype
