"""Where a training command reads its ds_config, and the trial's config put there (pure logic, real files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.errors import InputError
from tuner.measure.script.answer import script_answer
from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import batch_targets, find_slot, place, trial_config, user_config

USER = {
    "train_micro_batch_size_per_gpu": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "torch_adam": True}},
    "scheduler": {"type": "WarmupLR"},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "stage3_max_live_parameters": 123},
    "autotuning": {"enabled": True, "arg_mappings": {"train_micro_batch_size_per_gpu": "--bs"}},
}
TRIAL = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "train_batch_size": 16,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "ds.json").write_text(json.dumps(USER))
    return tmp_path


def command(folder: Path, *argv: str, at: str | None = None, maps: list[str] | None = None) -> ScriptCommand:
    return ScriptCommand.of(list(argv), str(folder), at, maps)


@pytest.mark.parametrize(
    ("argv", "source", "hf"),
    [
        (["deepspeed", "t.py", "--deepspeed", "--deepspeed_config", "ds.json"], "--deepspeed_config", False),
        (["python", "t.py", "--deepspeed", "ds.json", "--output_dir", "o"], "--deepspeed", True),
        (["torchrun", "t.py", "--deepspeed=ds.json"], "--deepspeed", True),
        (["accelerate", "launch", "--deepspeed_config_file", "ds.json", "t.py"], "--deepspeed_config_file", False),
    ],
)
def test_the_ds_config_flag_is_found(folder: Path, argv: list[str], source: str, hf: bool) -> None:
    slot = find_slot(command(folder, *argv))
    assert (slot.source, slot.hf) == (source, hf)
    assert user_config(command(folder, *argv), slot)["zero_optimization"]["stage"] == 3


def test_a_framework_config_file_names_it(folder: Path) -> None:
    """LLaMA-Factory's YAML: a ``deepspeed`` key beside the HF Trainer's batch keys (which then carry the batch)."""
    (folder / "train.yaml").write_text(
        yaml.safe_dump({"model": "x", "deepspeed": "ds.json", "per_device_train_batch_size": 1})
    )
    script = command(folder, "llamafactory-cli", "train", "train.yaml")
    slot = find_slot(script)
    assert (slot.key, slot.hf) == ("deepspeed", True)
    (folder / "run").mkdir()
    argv = place(script, slot, trial_config(USER, TRIAL), folder / "run")
    copied = yaml.safe_load(Path(argv[2]).read_text())
    assert copied["per_device_train_batch_size"] == 4 and copied["gradient_accumulation_steps"] == 2
    assert json.loads(Path(copied["deepspeed"]).read_text())["zero_optimization"]["stage"] == 2
    assert (folder / "train.yaml").read_text().count("ds.json") == 1  # the user's file is left as it was


def test_told_where_with_a_flag_or_a_file_key(folder: Path) -> None:
    (folder / "cfg.json").write_text(json.dumps({"trainer": {"ds": "ds.json"}}))
    assert find_slot(command(folder, "python", "t.py", "--ds", "ds.json", at="--ds")).source == "--ds"
    slot = find_slot(command(folder, "python", "t.py", "cfg.json", at="cfg.json:trainer.ds"))
    assert slot.key == "trainer.ds"
    with pytest.raises(InputError, match="ds-config-at"):
        find_slot(command(folder, "python", "t.py", at="--nope"))


def test_a_command_without_a_ds_config_has_its_config_merged_in_the_call(folder: Path) -> None:
    """DeepSpeedExamples' scripts build their config and pass it to ``deepspeed.initialize``: no file to replace."""
    script = command(folder, "deepspeed", "cifar10_deepspeed.py", "--deepspeed", "--lr", "1")
    slot = find_slot(script)
    assert slot.in_call and user_config(script, slot) == {}
    (folder / "run").mkdir()
    assert place(script, slot, TRIAL, folder / "run") == list(script.argv)  # the command is left as written
    assert json.loads((folder / "run" / "ds_config.json").read_text()) == TRIAL


def test_the_user_config_is_the_base_and_only_the_knobs_vary() -> None:
    config = trial_config(USER, TRIAL)
    assert config["optimizer"] == USER["optimizer"] and config["scheduler"] == USER["scheduler"]
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True, "stage3_max_live_parameters": 123}
    assert config["train_micro_batch_size_per_gpu"] == 4 and "autotuning" not in config


def test_hf_batch_flags_are_set_and_replaced(folder: Path) -> None:
    script = command(folder, "python", "t.py", "--deepspeed", "ds.json", "--per_device_train_batch_size=1")
    slot = find_slot(script)
    (folder / "run").mkdir()
    argv = place(script, slot, trial_config(USER, TRIAL), folder / "run")
    assert argv[argv.index("--per_device_train_batch_size") + 1] == "4"
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "2"
    assert json.loads(Path(argv[3]).read_text())["train_micro_batch_size_per_gpu"] == 4


def test_batch_flags_come_from_mappings_given_then_the_autotuning_section(folder: Path) -> None:
    script = command(folder, "deepspeed", "t.py", "--deepspeed_config", "ds.json")
    slot = find_slot(script)
    assert batch_targets(script, slot, USER) == {"train_micro_batch_size_per_gpu": "--bs"}
    given = command(
        folder, "deepspeed", "t.py", "--deepspeed_config", "ds.json", maps=["gradient_accumulation_steps=--ga"]
    )
    assert batch_targets(given, slot, USER) == {
        "train_micro_batch_size_per_gpu": "--bs",
        "gradient_accumulation_steps": "--ga",
    }
    with pytest.raises(InputError, match="arg-mapping"):
        command(folder, "python", "t.py", maps=["lr=--lr"])


def test_the_answer_fills_the_command_in(folder: Path) -> None:
    script = command(folder, "python", "t.py", "--deepspeed", "ds.json")
    slot = find_slot(script)
    from tuner.measure.script.answer import answer_record

    recorded = answer_record(script, slot, batch_targets(script, slot, {}), trial_config(USER, TRIAL))
    answer = script_answer(recorded, "best.json")
    assert answer is not None
    assert answer["command"] == (
        "python t.py --deepspeed best.json --per_device_train_batch_size 4 --gradient_accumulation_steps 2"
    )
    assert script_answer({"status": "ok"}) is None


def test_a_script_run_without_a_model_says_nothing_is_pruned_and_runs(folder: Path) -> None:
    """No refusal for the missing model: dstune says it prunes nothing, and runs the command (this one never reaches
    deepspeed.initialize: the study stops at its first trial saying so, exit 2)."""
    from typer.testing import CliRunner

    from tuner.cli.app import app

    (folder / "t.py").write_text("")
    command = ["python", str(folder / "t.py"), "--deepspeed", str(folder / "ds.json")]
    args = [
        "tune",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--launcher",
        "local",
        "--storage",
        f"sqlite:///{folder / 'x.db'}",
    ]
    args += ["--", *command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "prunes no config before it runs" in result.output
    assert "deepspeed.initialize" in result.output
