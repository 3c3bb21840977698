"""A failure inside ``deepspeed.zero.Init`` is the trial's config's, though it comes before ``deepspeed.initialize``:
``zero.Init`` reads the ds_config (the HF Trainer enters it under ZeRO-3 to build the model partitioned, from
``from_config`` or ``from_pretrained``), so DeepSpeed rejecting the config there is ``invalid_config``, and the study
goes on to other configs instead of stopping as for the script's own error."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tuner.measure.script.failures import ZERO_INIT

MARK = "dstune_phase"  # set on an exception that left zero.Init


def watch_zero_init(deepspeed: ModuleType) -> None:
    """Mark each exception that leaves ``deepspeed.zero.Init(...)`` as raised in :data:`ZERO_INIT`."""
    init_class = getattr(getattr(deepspeed, "zero", None), "Init", None)
    if init_class is None:
        return
    original = init_class.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except BaseException as error:
            setattr(error, MARK, ZERO_INIT)
            raise

    init_class.__init__ = __init__


def phase_of(error: BaseException, phase: str) -> str:
    """The phase ``error`` was raised in: :data:`ZERO_INIT` when it left ``zero.Init``, else ``phase``."""
    return str(getattr(error, MARK, phase))
