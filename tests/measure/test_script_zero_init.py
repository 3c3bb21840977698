"""A config DeepSpeed rejects inside ``deepspeed.zero.Init`` (entered by the HF Trainer under ZeRO-3 before
``deepspeed.initialize``) is the trial's fault, not the script's: the study goes on. transformers' ``run_clm.py``
under ``--use_cpu`` on 2 CPU ranks hit it at a ZeRO-3 trial (zero.Init reads the config before the process group is
up, counts a world of 1 and refuses the batch), and dstune stopped the whole study there as the script's own error."""

from __future__ import annotations

import pytest

from tuner.measure.script.failures import SCRIPT_FAILED, ZERO_INIT, CommandEnd, classify_end, exception_status
from tuner.measure.script.zero_init import phase_of, watch_zero_init

deepspeed = pytest.importorskip("deepspeed")
BATCH_2_OF_3 = {"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}


def test_a_config_refused_inside_zero_init_is_invalid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepspeed.zero.Init, "__init__", deepspeed.zero.Init.__init__)  # restored after the test
    watch_zero_init(deepspeed)
    with pytest.raises(AssertionError) as refused:
        deepspeed.zero.Init(config_dict_or_path=BATCH_2_OF_3)
    phase = phase_of(refused.value, "before_initialize")
    assert phase == ZERO_INIT and exception_status(refused.value, phase) == "invalid_config"


def test_a_failure_in_zero_init_does_not_stop_the_study() -> None:
    record = {"phase": ZERO_INIT, "status": "invalid_config", "exception_type": "AssertionError", "line": "batch"}
    status, kind, _ = classify_end(CommandEnd(None, 1, [record], False, ""), 60)
    assert (status, kind) == ("invalid_config", "AssertionError") and kind != SCRIPT_FAILED
    before = {**record, "phase": "before_initialize", "status": "error"}
    assert classify_end(CommandEnd(None, 1, [before], False, ""), 60)[1] == SCRIPT_FAILED  # the script's own
