"""``--sequence-parallel``, ``--tiled-mlp``, ``--tiled-loss``, ``--offload-checkpoints`` on ``dstune estimate``: they
write the ds_config keys the trial reads, ``--ds-config`` says the same, and a bad layout exits 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.cli.app import app
from tuner.cli.options import TUNE_FLAGS

runner = CliRunner()
LLAMA = ["--model", "llama-2-7b", "--model-impl", "builtin", "--gpus", "8", "--seq-len", "32768", "--stage", "3"]


def run_json(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--sequence-parallel", "3"], "sequence_parallel_size", id="sp-not-dividing-ranks"),
        pytest.param(["--gpus", "6", "--sequence-parallel", "6"], "sequence_parallel_size", id="sp-not-dividing-heads"),
        pytest.param(["--seq-len", "32769", "--sequence-parallel", "8"], "sequence_parallel_size", id="sp-seq"),
        pytest.param(["--attention", "eager", "--sequence-parallel", "2"], "sequence_parallel_size", id="eager"),
        pytest.param(["--offload-checkpoints"], "dstune.offload_checkpoints", id="offload-without-checkpointing"),
        pytest.param(["--seq-len", "64", "--tiled-loss", "128"], "dstune.tiled_loss_shards", id="too-many-shards"),
        pytest.param(["--sequence-parallel", "0"], "sequence-parallel", id="zero-sp"),
    ],
)
def test_bad_layouts_exit_2_naming_the_field(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["estimate", *LLAMA, *args, "--json"])
    assert_usage_error(result, field)


def test_flags_and_ds_config_give_the_same_estimate(tmp_path: Path) -> None:
    flags = run_json(*LLAMA, "--sequence-parallel", "8", "--tiled-loss", "8", "--tiled-mlp", "4")
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps({"sequence_parallel_size": 8, "dstune": {"tiled_loss_shards": 8, "tiled_mlp_shards": 4}})
    )
    assert run_json(*LLAMA, "--ds-config", str(path))["per_gpu"] == flags["per_gpu"]
    plain = run_json(*LLAMA)
    assert flags["per_gpu"]["activations"] < plain["per_gpu"]["activations"] / 8


def test_offloaded_checkpoints_show_in_host_memory() -> None:
    args = [*LLAMA, "--sequence-parallel", "8", "--activation-checkpointing"]
    kept, offloaded = run_json(*args), run_json(*args, "--offload-checkpoints")
    assert "activations" not in kept["cpu_per_node"]
    assert offloaded["cpu_per_node"]["activations"] > 0
    assert offloaded["cpu_per_node"]["total"] > kept["cpu_per_node"]["total"]


def test_measure_and_tune_take_the_flags() -> None:
    for command in ("measure", "tune"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        for flag in ("--sequence-parallel", "--tiled-mlp", "--tiled-loss", "--offload-checkpoints"):
            assert flag in result.output, (command, flag)
    assert {"sequence_parallel", "tiled_mlp", "tiled_loss", "offload_checkpoints"} <= set(TUNE_FLAGS)


def test_tune_pins_the_flags_given_and_refuses_a_bad_layout_before_any_run(tmp_path: Path) -> None:
    from tuner.cli.options import WorkloadFlags
    from tuner.cli.tune import _long_context_pins

    flags = WorkloadFlags(
        layouts={"sequence_parallel": 2, "tensor_parallel": None, "expert_parallel": None, "hpz_partition_size": None},
        tiled_mlp=None,
        tiled_loss=8,
        offload_checkpoints=None,
    )
    assert _long_context_pins(flags) == {"sequence_parallel": 2, "tiled_loss_shards": 8}
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ["tune", *LLAMA[:-2], "--device", "cpu", "--sequence-parallel", "3", "--storage", storage]
    assert_usage_error(runner.invoke(app, args), "sequence_parallel_size")
