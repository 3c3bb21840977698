"""``--expert-parallel`` on ``dstune estimate``, ``measure`` and ``tune``: it writes the ds_config keys the trial reads
(``expert_parallel: {enabled, autoep_size}``), ``--ds-config`` says the same, the estimate is the rank's (its local
experts), and a layout DeepSpeed's AutoEP refuses exits 2 with one line naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_configs import TINY_CONFIGS
from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.cli.app import app
from tuner.cli.options import LONG_CONTEXT_PINS, TUNE_FLAGS

runner = CliRunner()
QWEN2_MOE = {**TINY_CONFIGS["qwen2_moe"], "num_hidden_layers": 2, "mlp_only_layers": [], "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def moe_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps(QWEN2_MOE))
    return str(path)


def estimate(config: str, *args: str) -> dict:
    flags = ["--model", config, "--gpus", "2", "--device", "cpu", "--seq-len", "64", "--stage", "2"]
    result = runner.invoke(app, ["estimate", *flags, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_flag_gives_the_ds_config_figures_and_a_rank_holds_half_the_experts(
    moe_config: str, tmp_path: Path
) -> None:
    plain, flagged = estimate(moe_config), estimate(moe_config, "--expert-parallel", "2")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"expert_parallel": {"enabled": True, "autoep_size": 2}}))
    assert estimate(moe_config, "--ds-config", str(path))["per_gpu"] == flagged["per_gpu"]
    assert flagged["n_params"] == plain["n_params"] == 189_632  # as transformers counts it (autoep_check.md)
    assert flagged["details"]["ep_local_elements"] == 152_768  # measured per rank with AutoEP 2
    assert flagged["per_gpu"]["parameters"] < plain["per_gpu"]["parameters"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--expert-parallel", "3"], "expert_parallel.autoep_size", id="not-dividing-experts"),
        pytest.param(["--expert-parallel", "4"], "expert_parallel.autoep_size", id="not-dividing-ranks"),
        pytest.param(["--expert-parallel", "0"], "expert-parallel", id="zero"),
    ],
)
def test_bad_degrees_exit_2_naming_the_field(moe_config: str, args: list[str], field: str) -> None:
    flags = ["--model", moe_config, "--gpus", "2", "--device", "cpu", "--seq-len", "64"]
    assert_usage_error(runner.invoke(app, ["estimate", *flags, *args, "--json"]), field)


def test_a_dense_model_is_refused() -> None:
    result = runner.invoke(app, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--expert-parallel", "2"])
    assert_usage_error(result, "expert_parallel.autoep_size")
    assert "MoE" in result.stderr


def test_measure_and_tune_take_the_flag() -> None:
    for command in ("measure", "tune"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--expert-parallel" in result.output, command
    assert "expert_parallel" in TUNE_FLAGS and LONG_CONTEXT_PINS["expert_parallel"] == "expert_parallel"
