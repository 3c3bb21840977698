"""What the CLI prints of a memory size is in the units people read (MiB, GiB, TiB), never a bare count of bytes:
an estimate that does not fit, and a size refused for being too large."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

runner = CliRunner()
BARE_BYTES = re.compile(r"\d{7,}")  # seven digits or more, no thousands separator: a byte count nobody reads


def test_an_estimate_that_does_not_fit_says_by_how_much_in_gib() -> None:
    result = runner.invoke(app, ["estimate", "--params", "8e9", "--gpus", "1", "--gpu-memory", "24GiB"])
    line = next(line for line in result.output.splitlines() if "DOES NOT FIT" in line)
    assert re.search(r"short by [\d.]+ GiB", line) and not BARE_BYTES.search(line), line


@pytest.mark.parametrize("flag", ["--gpu-memory", "--cpu-memory"])
def test_a_size_too_large_is_refused_in_tib(flag: str) -> None:
    result = runner.invoke(app, ["estimate", "--params", "1e9", flag, "1e30"])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {flag[2:]}: must be at most 1,048,576 TiB")
    assert not BARE_BYTES.search(result.stderr), result.stderr
