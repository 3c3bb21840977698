"""A script that builds its config in Python and passes it to ``deepspeed.initialize`` (DeepSpeedExamples' cifar and
HelloDeepSpeed, DeepSpeed-Chat): the trial's decisions merged over what it passes, whichever way it passes it."""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

from tuner.measure.script.in_call import merged_call

OWN = {
    "train_batch_size": 16,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 0},
}
DECISIONS = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


def initialize(args=None, model=None, optimizer=None, model_parameters=None, config=None, config_params=None):
    """deepspeed.initialize's parameters that matter here, in its order."""


def expect_merged(config: dict) -> None:
    assert config["optimizer"] == OWN["optimizer"] and config["bf16"] == {"enabled": True}
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (8, 2)


def test_a_config_dict_in_the_call_is_the_base() -> None:
    args, kwargs, config = merged_call(initialize, (None, "model"), {"config": dict(OWN)}, DECISIONS)
    expect_merged(config)
    assert kwargs["config"] is config and args[1] == "model"


def test_a_config_in_the_scripts_args_moves_into_the_call(tmp_path: Path) -> None:
    """``args.deepspeed_config`` and a config in the call both given make DeepSpeed refuse: the call's alone."""
    (tmp_path / "ds.json").write_text(json.dumps(OWN))
    namespace = argparse.Namespace(deepspeed_config=str(tmp_path / "ds.json"), local_rank=0)
    args, _, config = merged_call(initialize, (), {"args": namespace, "model": "m"}, DECISIONS)
    expect_merged(config)
    assert args[0].deepspeed_config is None and namespace.deepspeed_config  # the script's own is untouched


def test_a_path_an_inline_string_or_the_legacy_keyword() -> None:
    encoded = base64.urlsafe_b64encode(json.dumps(OWN).encode()).decode()
    expect_merged(merged_call(initialize, (), {"config_params": encoded}, DECISIONS)[2])
    _, kwargs, config = merged_call(initialize, (), {"model": "m"}, DECISIONS)  # nothing given: the trial's alone
    assert config == DECISIONS and "config_params" not in kwargs
