"""The caching-allocator settings a trial's ds_config asks of a CUDA run (``dstune.expandable_segments``, a
search-space parameter): the ``PYTORCH_CUDA_ALLOC_CONF`` value to run with, and the ds_config DeepSpeed gets (without
dstune's own section). Pure: the runner applies the result before CUDA is first used."""

from __future__ import annotations

import os
from typing import Any

from tuner.workload import TrialConfig

VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf(ds_config: dict[str, Any], current: str | None) -> str | None:
    """``current`` (the environment's ``PYTORCH_CUDA_ALLOC_CONF``) with ``expandable_segments:True`` set when the
    config asks for it; None when the config asks nothing (the environment stays as it is).

    Example:
        >>> alloc_conf({"dstune": {"expandable_segments": True}}, "max_split_size_mb:128")
        'max_split_size_mb:128,expandable_segments:True'
        >>> alloc_conf({}, "expandable_segments:True") is None
        True
    """
    if not TrialConfig(ds_config).expandable_segments:
        return None
    options = [part for part in (current or "").split(",") if part and not part.startswith("expandable_segments:")]
    return ",".join([*options, "expandable_segments:True"])


def apply_alloc_conf(ds_config: dict[str, Any]) -> None:
    """Set the allocator settings ``ds_config`` asks for before CUDA allocates: in the environment (children and a
    lazily read config see it) and in the live allocator."""
    import torch

    conf = alloc_conf(ds_config, os.environ.get(VARIABLE))
    if conf is None:
        return
    os.environ[VARIABLE] = conf
    setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is not None:
        setter("expandable_segments:True")
