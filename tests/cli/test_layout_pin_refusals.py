"""A pin overrides the space's conditions where the workload can take the pinned layout, and is refused at start
where it cannot, by the layouts' own checks: one line naming the pin and the real reason, exit 2, nothing written
(``--pin expert_parallel=2`` on a dense model pruned every trial with the estimator's reason instead)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.storage import Store

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "pin", "why"),
    [
        (
            ["--pin", "expert_parallel=2"],
            "expert_parallel",
            "AutoEP needs an MoE model: tiny-llama has no routed experts",
        ),
        (
            ["--gpus", "4", "--pin", "tensor_parallel=2", "--pin", "sequence_parallel=2"],
            "tensor_parallel",
            "AutoTP with Ulysses",
        ),
    ],
)
def test_a_pinned_layout_the_workload_cannot_take_exits_2_at_start(
    tmp_path: Path, flags: list[str], pin: str, why: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ["tune", "--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "64", "--study", "s"]
    result = runner.invoke(app, [*args, "--global-batch", "8", "--storage", storage, *flags])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: pins.{pin}: pinned to 2, which this workload cannot run: ") and why in line
    assert Store.open(storage).get_study("s") is None
