"""The workload flags declared once (``tuner.cli.options``): a command gets exactly the flags it asks for, as one
WorkloadFlags, at the place of its ``flags`` parameter."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.cli.options import TUNE_FLAGS, WorkloadFlags, workload_options

runner = CliRunner()


def _probe(**options: object) -> tuple[typer.Typer, list[tuple[WorkloadFlags, int]]]:
    """A one-command app whose command records what it was called with."""
    calls: list[tuple[WorkloadFlags, int]] = []
    probe = typer.Typer()

    @probe.command()
    @workload_options(**options)
    def run(flags: WorkloadFlags, extra: Annotated[int, typer.Option(help="Not a workload flag.")] = 7) -> None:
        """Record the flags."""
        calls.append((flags, extra))

    return probe, calls


def test_flags_arrive_as_one_object() -> None:
    probe, calls = _probe()
    result = runner.invoke(probe, ["--model", "tiny-gpt2", "--gpus", "4", "--stage", "3", "--extra", "9"])
    assert result.exit_code == 0, result.output
    [(flags, extra)] = calls
    assert flags == WorkloadFlags(model="tiny-gpt2", gpus=4, stage=3) and extra == 9


def test_only_and_overrides() -> None:
    device = Annotated[str, typer.Option(help="Where.")]
    probe, calls = _probe(only=("model", "device"), overrides={"device": (device, "tpu")})
    assert runner.invoke(probe, ["--model", "tiny-gpt2"]).exit_code == 0
    assert calls[0][0] == WorkloadFlags(model="tiny-gpt2", device="tpu")  # the override's default and free text
    assert runner.invoke(probe, ["--model", "tiny-gpt2", "--device", "abc"]).exit_code == 0
    assert calls[1][0].device == "abc"
    assert runner.invoke(probe, ["--model", "tiny-gpt2", "--stage", "3"]).exit_code == 2  # --stage was not asked for


def test_command_without_flags_parameter_is_refused() -> None:
    with pytest.raises(TypeError, match="flags"):
        workload_options()(lambda extra=1: None)
    with pytest.raises(TypeError, match="not workload flags: colour"):
        workload_options(only=("model", "colour"))


@pytest.mark.parametrize(
    ("command", "present", "absent"),
    [
        ("estimate", ["--params", "--micro-batch", "--ds-config", "--json"], ["--global-batch"]),
        ("measure", ["--params", "--micro-batch", "--ds-config", "--steps"], ["--global-batch"]),
        ("tune", [f"--{name.replace('_', '-')}" for name in TUNE_FLAGS] + ["--nvme-path"], ["--params", "--stage"]),
    ],
)
def test_commands_offer_their_workload_flags(command: str, present: list[str], absent: list[str]) -> None:
    result = runner.invoke(app, [command, "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for flag in present:
        assert flag in result.stdout, flag
    for flag in absent:
        assert f"{flag} " not in result.stdout, flag
