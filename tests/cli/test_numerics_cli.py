"""``dstune estimate``'s numerics-changing flags: bf16 master weights and optimizer states, Muon, the chunked loss."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.cli.app import app

runner = CliRunner()
TINY = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "1024"]


def run_json(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", *TINY, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bf16_master_and_states_shrink_the_optimizer_states() -> None:
    reference = run_json("--stage", "3")
    bf16 = run_json("--stage", "3", "--bf16-master-weights", "--bf16-optimizer-states")
    assert bf16["per_gpu"]["optimizer_states"] * 2 == reference["per_gpu"]["optimizer_states"]  # 6 of 12 bytes


def test_muon_and_the_chunked_loss_are_estimated() -> None:
    reference = run_json("--stage", "2")
    assert run_json("--stage", "2", "--optimizer", "muon")["per_gpu"]["total"] != reference["per_gpu"]["total"]
    gpt2 = ["--model", "gpt2", "--gpus", "2", "--device", "cpu", "--seq-len", "1024", "--micro-batch", "8"]
    hf = json.loads(runner.invoke(app, ["estimate", *gpt2, "--json"]).stdout)
    chunked = json.loads(runner.invoke(app, ["estimate", *gpt2, "--chunked-loss", "--json"]).stdout)
    assert hf["peak_phase"] == chunked["peak_phase"] == "forward"  # the loss's moment sets the peak
    assert chunked["per_gpu"]["total"] < hf["per_gpu"]["total"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--stage", "2", "--bf16-optimizer-states"], "bf16.bf16_optimizer_states", id="states-alone"),
        pytest.param(["--stage", "2", "--bf16-master-weights"], "bf16.bf16_master_weights_and_grads", id="no-offload"),
        pytest.param(
            ["--stage", "0", "--bf16-master-weights", "--bf16-optimizer-states"],
            "bf16.bf16_master_weights_and_grads",
            id="stage-0",
        ),
        pytest.param(["--stage", "3", "--optimizer", "muon"], "optimizer.type", id="muon-zero-3"),
        pytest.param(["--optimizer", "sgd"], "optimizer", id="unknown-optimizer"),
        pytest.param(["--params", "1e9", "--stage", "2", "--optimizer", "muon"], "optimizer.type", id="muon-bare"),
    ],
)
def test_refused_combinations_exit_2_naming_the_field(args: list[str], field: str) -> None:
    base = TINY if "--params" not in args else ["--gpus", "2", "--device", "cpu"]
    result = runner.invoke(app, ["estimate", *base, *args, "--json"])
    assert_usage_error(result, field)
