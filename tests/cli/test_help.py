"""What ``--help`` and ``docs/commands.md`` say of the commands: every flag of every command is in commands.md (it
claims every flag), and ``--help`` at 80 columns cuts no flag name or help text, overruns no line and shows no Sphinx
markup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tuner.cli.app import app

COMMANDS_MD = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
NAMES = tuple(typer.main.get_command(app).commands)  # type: ignore[attr-defined]  # every command, queue included


def flags(name: str) -> set[str]:
    """The long option names of command ``name``, as click parses them."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--") and opt != "--help"}


@pytest.mark.parametrize("name", NAMES)
def test_commands_md_names_every_flag(name: str) -> None:
    documented = set(re.findall(r"--[a-z][a-z0-9-]*", COMMANDS_MD.read_text()))
    missing = sorted(flags(name) - documented)
    assert not missing, f"docs/commands.md does not name {name}'s {', '.join(missing)}"


@pytest.mark.parametrize("name", NAMES)
def test_help_at_80_columns_cuts_nothing_and_shows_no_markup(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    wide = [line for line in result.output.splitlines() if len(line) > 80]
    assert not wide, f"{name} --help overruns 80 columns: {wide}"
    assert not re.search(r"``|:mod:|:func:|:class:", result.output), result.output
    for flag in flags(name):
        assert flag in result.output, flag
