"""The forms a ds_config takes on commands written without dstune in mind, as DeepSpeed, the HF Trainer and accelerate
accept them: a base64 string or JSON text on the command line itself, an HJSON file (comments, trailing commas), an
HF ``--deepspeed`` file without a ``.json`` suffix. Each is read as the user's base and replaced by the trial's file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import find_slot, place, trial_config, user_config

USER = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3}}
TRIAL = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}}
B64 = base64.urlsafe_b64encode(json.dumps(USER).encode()).decode()
HJSON = """{
  # DeepSpeed reads its config file with hjson
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,},},
  zero_optimization: {stage: 3},
}
"""


def command(tmp_path: Path, *argv: str) -> ScriptCommand:
    return ScriptCommand.of(list(argv), str(tmp_path))


@pytest.mark.parametrize(
    ("argv", "source", "hf"),
    [
        (["deepspeed", "t.py", "--deepspeed", "--deepspeed_config", B64], "--deepspeed_config", False),
        (["torchrun", "t.py", "--deepspeed", B64, "--output_dir", "o"], "--deepspeed", True),
        (["python", "t.py", f"--deepspeed={json.dumps(USER)}"], "--deepspeed", True),
    ],
)
def test_a_config_given_inline_is_the_base_and_the_trial_gets_a_file(
    tmp_path: Path, argv: list[str], source: str, hf: bool
) -> None:
    script = command(tmp_path, *argv)
    slot = find_slot(script)
    assert (slot.source, slot.hf) == (source, hf)
    assert user_config(script, slot) == USER
    (tmp_path / "run").mkdir()
    placed = place(script, slot, trial_config(USER, TRIAL), tmp_path / "run")
    written = json.loads(Path(placed[slot.index]).read_text())
    assert written["optimizer"] == USER["optimizer"] and written["zero_optimization"] == {"stage": 1}


def test_an_hjson_ds_config_is_read_as_deepspeed_reads_it(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(HJSON)
    script = command(tmp_path, "deepspeed", "t.py", "--deepspeed_config", "ds.json")
    assert user_config(script, find_slot(script)) == USER


def test_an_hf_deepspeed_file_without_a_json_suffix_is_found(tmp_path: Path) -> None:
    (tmp_path / "zero2.conf").write_text(json.dumps(USER))
    script = command(tmp_path, "python", "t.py", "--deepspeed", "zero2.conf")
    slot = find_slot(script)
    assert (slot.source, slot.hf) == ("--deepspeed", True) and user_config(script, slot) == USER


def test_a_script_naming_its_batch_with_the_hf_flags_gets_the_trials_batch_on_them(tmp_path: Path) -> None:
    """accelerate's and DeepSpeed-Chat's scripts feed their data loader from ``--per_device_train_batch_size``: left
    as written, the forward saw the script's batch while the throughput counted the config's."""
    (tmp_path / "ds.json").write_text(json.dumps(USER))
    (tmp_path / "acc.yaml").write_text(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"
    )
    argv = ["accelerate", "launch", "--config_file", "acc.yaml", "t.py", "--per_device_train_batch_size=8", "--lr", "1"]
    script = command(tmp_path, *argv)
    (tmp_path / "run").mkdir()
    placed = place(script, find_slot(script), trial_config(USER, TRIAL), tmp_path / "run")
    assert placed[placed.index("--per_device_train_batch_size") + 1] == "2"
    assert "--gradient_accumulation_steps" not in placed  # a flag the command does not carry is never added


def test_measure_runs_the_batch_the_command_asks_for_where_its_config_says_auto(tmp_path: Path) -> None:
    """``dstune measure -- ... --per_device_train_batch_size 2`` with an HF ``auto`` config measured micro-batch 1
    (``--micro-batch``'s default), rewriting the command's own flag."""
    from tuner.cli.options import WorkloadFlags
    from tuner.cli.script_options import script_trial

    auto = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    (tmp_path / "ds.json").write_text(json.dumps(auto))
    argv = ["deepspeed", "t.py", "--deepspeed", "ds.json", "--per_device_train_batch_size", "2"]
    config = script_trial(command(tmp_path, *argv, "--gradient_accumulation_steps=3"), WorkloadFlags(), 2).ds_config
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (2, 3)
    assert config["train_batch_size"] == 12
    (tmp_path / "ds.json").write_text(json.dumps({**auto, "train_micro_batch_size_per_gpu": 4}))
    config = script_trial(command(tmp_path, *argv), WorkloadFlags(), 2).ds_config
    assert config["train_micro_batch_size_per_gpu"] == 4  # a number in the config is what DeepSpeed runs


@pytest.mark.parametrize(
    ("argv", "precision"),
    [
        (["deepspeed", "t.py", "--deepspeed", "ds.json", "--output_dir", "o"], "fp32"),
        (["deepspeed", "t.py", "--deepspeed", "ds.json", "--bf16", "--output_dir", "o"], "bf16"),
        (["torchrun", "t.py", "--deepspeed", "ds.json", "--fp16=true", "--bf16", "false"], "fp16"),
        (["accelerate", "launch", "--config_file", "acc.yaml", "t.py"], "fp32"),
        (["accelerate", "launch", "--config_file", "acc.yaml", "--mixed_precision", "bf16", "t.py"], "bf16"),
    ],
)
def test_an_auto_precision_is_what_the_trainer_fills_it_with(tmp_path: Path, argv: list[str], precision: str) -> None:
    """HF's ``"auto"`` bf16 section is filled from the Trainer's own ``--bf16`` (accelerate's from
    ``mixed_precision``): run_clm.py without ``--bf16`` trained in fp32 while the study said bf16 (--precision's
    default)."""
    from tuner.cli.script_options import script_precision

    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}))
    (tmp_path / "acc.yaml").write_text("deepspeed_config:\n  deepspeed_config_file: ds.json\nmixed_precision: 'no'\n")
    assert script_precision(command(tmp_path, *argv)) == precision


@pytest.mark.parametrize(
    ("argv", "yaml_extra", "precision"),
    [
        (["deepspeed", "sft.py", "--config", "sft.yaml"], "", "bf16"),
        (["trl", "sft", "--config", "sft.yaml"], "", "bf16"),
        (["deepspeed", "sft.py", "--config", "sft.yaml"], "fp16: true\n", "fp16"),
        (["deepspeed", "sft.py", "--config", "sft.yaml", "--bf16", "false"], "", "fp32"),
        (["deepspeed", "plain.py", "--config", "sft.yaml"], "", "fp32"),
    ],
)
def test_trl_trains_in_bf16_unless_told_otherwise(
    tmp_path: Path, argv: list[str], yaml_extra: str, precision: str
) -> None:
    """TRL's configs default ``bf16`` to true where ``fp16`` is not set (the HF Trainer's default is false)."""
    from tuner.cli.script_options import script_precision

    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": "auto"}}))
    (tmp_path / "sft.yaml").write_text(f"deepspeed: ds.json\nper_device_train_batch_size: 2\n{yaml_extra}")
    (tmp_path / "sft.py").write_text("from trl import SFTTrainer\n")
    (tmp_path / "plain.py").write_text("import transformers\n")
    assert script_precision(command(tmp_path, *argv)) == precision
