"""``dstune tune|measure -- <command>`` without ``--model``: no refusal for the missing model (the study learns from
its runs), but a flag that describes a model (``--peft``, ``--freeze``) is one line naming it, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.cli.options import WorkloadFlags
from tuner.cli.script_model import command_digest, no_model_workload
from tuner.measure.script.command import ScriptCommand

runner = CliRunner()
COMMAND = ["--", "python", "train.py", "--deepspeed", "ds.json"]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": False}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", ["tune", "measure"])
@pytest.mark.parametrize(("flag", "value"), [("--peft", "adapter_config.json"), ("--freeze", "embed")])
def test_a_model_flag_without_a_model_is_one_line_exit_2(folder: Path, command: str, flag: str, value: str) -> None:
    result = runner.invoke(
        app, [command, "--gpus", "2", "--device", "cpu", "--launcher", "local", flag, value, *COMMAND]
    )
    assert result.exit_code == 2, result.output
    assert flag[2:] in result.output and "give --model too" in result.output
    assert "Traceback" not in result.output


def test_each_commands_model_is_a_workload_of_its_own(folder: Path) -> None:
    """Two commands (or one in two folders) are two models: their studies and answers never mix."""
    flags = WorkloadFlags(gpus=2, device="cpu")
    here = ScriptCommand(("python", "train.py"), str(folder))
    there = ScriptCommand(("python", "train.py"), str(folder / "other"))
    first, _ = no_model_workload(flags, here)
    second, _ = no_model_workload(flags, there)
    assert first.model.is_unknown and first.model.n_params == 0 and first.profile is None
    assert first.fingerprint() != second.fingerprint()
    assert command_digest(here) in first.model.name


def test_a_run_of_a_commands_own_model_prints_what_was_measured_and_says_why_no_estimate() -> None:
    """samples/s (tokens/s only when known), no model FLOPs, and the reason there is no estimate as it stands."""
    import io

    from rich.console import Console

    from tuner.cli.measure import render_measurement

    result = {
        "status": "ok",
        "error": None,
        "tokens_per_s": None,
        "samples_per_s": 88.7,
        "step_time_s": {"p50": 0.045, "p90": 0.074},
        "tflops_per_device": None,
        "ranks": [],
        "estimate": None,
        "estimate_assumes": "no estimate: no --model describes the command's model",
    }
    out = io.StringIO()
    render_measurement(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "throughput: 88.70 samples/s" in text and "tokens/s" not in text and "TFLOP" not in text
    assert "no estimate: no --model" in text and "the estimate assumes" not in text
