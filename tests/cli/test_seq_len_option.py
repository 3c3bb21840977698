"""``--seq-len`` of estimate and measure: a number of tokens; ``max``, which tune and the API take, is refused in one
line that points to the commands searching the longest length."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("command", ["estimate", "measure"])
def test_max_points_to_the_commands_that_search_it(command: str) -> None:
    result = runner.invoke(app, [command, "--params", "1e9", "--seq-len", "max"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: seq-len: max is searched by dstune estimate --max-seq-len"), result.stderr
    assert "tune --seq-len max" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(("value", "says"), [("0", "0 is below 1 token"), ("2k", "'2k' is not a whole number")])
def test_a_length_that_is_no_count_of_tokens_is_refused(value: str, says: str) -> None:
    result = runner.invoke(app, ["estimate", "--params", "1e9", "--seq-len", value])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: seq-len: {says}"), result.stderr


def test_a_length_with_thousands_separators_is_the_number() -> None:
    plain = runner.invoke(app, ["estimate", "--params", "1e9", "--seq-len", "4096", "--json"])
    separated = runner.invoke(app, ["estimate", "--params", "1e9", "--seq-len", "4,096", "--json"])
    assert plain.exit_code == separated.exit_code == 0 and plain.stdout == separated.stdout
