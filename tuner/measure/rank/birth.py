"""Where a rank's model is born: sharded under ZeRO-3, on the device in the training dtype otherwise.

Before this, every rank built the whole model in fp32 on the host (4 bytes × Ψ per rank: 280 GB for a 70B model)
and DeepSpeed then cast, moved and partitioned it. Now no path holds a full fp32 copy on the host:

* ZeRO-3 builds the model under :class:`deepspeed.zero.Init`: each module's parameters are created in the training
  dtype on the rank's device (``LOCAL_RANK``), then partitioned as soon as the module's ``__init__`` returns, so a
  rank holds ``e·Ψ/N`` bytes of shards plus, for a moment, the largest module whole. With ``offload_param`` the
  shards go to the host (DeepSpeed reads ``remote_device`` from the config), which is the point of offloading.
* Stages 0-2 build under ``torch.device(device)`` with the training dtype as the default dtype: every parameter is
  allocated once, directly on the device, in its final dtype, and initialised there. DeepSpeed's ``initialize``
  then finds nothing to move or cast. (Building on ``meta`` and ``to_empty`` would allocate the same bytes but leave
  non-persistent buffers, such as transformers' rotary ``inv_freq``, uninitialised and every module's weights to be
  re-initialised by hand; the default-device build is what PyTorch documents for constructing on a device.)

A transformers model under ZeRO-3 is built inside the same ``zero.Init`` (transformers' own route,
``HfDeepSpeedConfig``, needs ``accelerate``, which dstune does not install). Its ``_init_weights`` then sees empty
partitions, so parameters that only ``_init_weights`` initialises keep whatever the allocator left: the fused
experts and router of Mixtral-style MoE layers are ``torch.empty`` until then, and trained NaN from the first step
(every step skipped, so the run measured a model that never stepped). :func:`initialise_partitioned` runs the model's
own ``_init_weights`` again, one module at a time with its parameters gathered.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tuner.workload import TrialConfig

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def rss_bytes() -> int:
    """This process's resident set right now (``/proc/self/statm``), in bytes."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def training_dtype(precision: str) -> Any:
    """The torch dtype of trained parameters for ``bf16``, ``fp16`` or ``fp32``."""
    import torch

    return getattr(torch, DTYPES[precision])


@contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    """Make ``dtype`` torch's default floating dtype inside the block."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def born_on_device(ds_config: dict[str, Any], device: str, transformers: bool = False) -> Iterator[None]:
    """Build the model inside this block: sharded under ZeRO-3, else on ``device`` in the training dtype.

    Args:
        ds_config: the run's ds_config, already accepted by DeepSpeed (its stage and precision decide; ZeRO-3 also
            reads its dtype and ``offload_param`` from it).
        device: ``cpu`` or ``cuda`` (CUDA: the current device, which the runner set from ``LOCAL_RANK``).
        transformers: the model is a transformers model (``torch._dynamo`` is imported before ``zero.Init``).
    """
    import torch

    trial = TrialConfig(ds_config)
    stage, dtype = trial.stage, training_dtype(trial.precision)
    with ExitStack() as stack:
        if stage == 3:
            import deepspeed

            if transformers:
                # zero.Init patches Tensor.__new__, which importing torch._dynamo (transformers does) then rejects
                import torch._dynamo

            # The dtype comes from the config: DeepSpeed 0.19.8 replaces an explicit dtype=torch.float32 with
            # bf16 on accelerators without fp16 (an operator-precedence slip in Init._set_dtype).
            stack.enter_context(deepspeed.zero.Init(config_dict_or_path=ds_config))
        else:
            target = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
            stack.enter_context(target)
        stack.enter_context(default_dtype(dtype))
        yield


def initialise_partitioned(model: Any) -> None:
    """Run a transformers model's ``_init_weights`` (of ``model`` or its first module that has one) on every module,
    its own parameters gathered (ZeRO-3), so parameters only ``_init_weights`` initialises (``torch.empty`` experts)
    hold real values on every rank.

    One module's parameters are whole at a time (rank 0 initialises, DeepSpeed broadcasts on release), as when the
    model was born; a model without ``_init_weights`` (dstune's built-in one initialises in ``__init__``) is left
    alone.
    """
    import deepspeed
    import torch

    owner = next((module for module in model.modules() if hasattr(module, "_init_weights")), None)
    if owner is None or not any(hasattr(param, "ds_id") for param in owner.parameters()):  # not born under ZeRO-3
        return
    init = owner._init_weights
    for module in owner.modules():
        params = list(module.parameters(recurse=False))
        if not params:
            continue
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
            for param in params:  # transformers skips what it marked initialised while the partitions were empty
                if hasattr(param, "_is_hf_initialized"):
                    param._is_hf_initialized = False
            init(module)
