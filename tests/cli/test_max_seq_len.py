"""``dstune estimate --max-seq-len``: the answer as a table and as JSON beside the usual estimate, pins from the
flags given, exit codes (2 bad input, 1 nothing fits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

runner = CliRunner()
BUILTIN = ("--model", "llama-2-7b", "--model-impl", "builtin")


def _json(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", *args, "--max-seq-len", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1
    return json.loads(result.stdout)


def test_json_is_the_estimate_of_the_answer_with_a_max_seq_len_object() -> None:
    data = _json(*BUILTIN, "--gpus", "8")
    answer = data["max_seq_len"]
    assert answer["seq_len"] % 256 == 0 and answer["seq_len"] > 4096
    assert data["fits"] is True and data["per_gpu"]["total"] == answer["gpu_total"]
    assert answer["next_limit"]["seq_len"] == answer["seq_len"] + answer["multiple"]
    assert answer["next_limit"]["memory"] in ("gpu", "cpu") and answer["next_limit"]["category"]
    assert answer["ds_config"]["zero_optimization"]["stage"] in (0, 1, 2, 3)
    assert answer["data_parallel"] * answer["sequence_parallel"] == 8
    assert answer["beyond_max_positions"] is True  # Llama-2's 4,096 positions are no cap
    assert "throughput" in data


def test_flags_given_pin_and_defaults_do_not() -> None:
    free = _json(*BUILTIN)["max_seq_len"]
    pinned = _json(*BUILTIN, "--stage", "2", "--no-activation-checkpointing")["max_seq_len"]
    assert pinned["ds_config"]["zero_optimization"]["stage"] == 2
    assert pinned["activation_checkpointing"] is False
    assert pinned["candidates"] < free["candidates"] and pinned["seq_len"] < free["seq_len"]
    assert free["activation_checkpointing"] is True  # the default --no-... was not a pin


def test_ds_config_pins_a_layout(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"sequence_parallel_size": 2, "zero_optimization": {"stage": 3}}))
    result = runner.invoke(app, ["estimate", *BUILTIN, "--gpus", "4", "--ds-config", str(config), "--max-seq-len",
                                 "--json"])  # fmt: skip
    if result.exit_code == 2:  # an estimator that refuses the layout says which key, on one line
        assert result.output.count("\n") == 1 and "sequence_parallel" in result.output
        return
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 0:
        answer = json.loads(result.stdout)["max_seq_len"]
        assert answer["sequence_parallel"] == 2 and answer["data_parallel"] == 2
        assert answer["ds_config"]["zero_optimization"]["stage"] == 3


def test_table_names_the_answer_and_the_limit() -> None:
    result = runner.invoke(app, ["estimate", *BUILTIN, "--gpus", "8", "--max-seq-len"])
    assert result.exit_code == 0, result.output
    assert "longest sequence" in result.output and "next limit" in result.output
    assert "its estimate at" in result.output


@pytest.mark.parametrize(
    ("args", "field"),
    [(("--seq-len", "4096"), "seq-len"), (("--stage", "5"), "stage"), (("--micro-batch", "0"), "micro-batch")],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], field: str) -> None:
    result = runner.invoke(app, ["estimate", *BUILTIN, *args, "--max-seq-len"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and field in result.output


def test_nothing_fits_exits_1_on_one_line() -> None:
    result = runner.invoke(
        app, ["estimate", "--model", "llama-3.1-70b", "--model-impl", "builtin", "--gpu-memory", "8GiB",
              "--cpu-memory", "64GiB", "--max-seq-len"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.output.strip().count("\n") == 0 and "nothing fits" in result.output


@pytest.mark.slow
def test_a_transformers_model_is_traced_at_three_lengths_and_extrapolated(tmp_path) -> None:
    """The traced profile's extrapolation gives the bytes a trace at the answer's length gives (the answer's whole
    ds_config, its layout and ALST settings included, estimated again at that length)."""
    data = _json("--model", "tiny-llama", "--gpus", "2", "--gpu-memory", "4GiB", "--cpu-memory", "64GiB")
    answer = data["max_seq_len"]
    assert data["activations_source"] == "trace"
    config = tmp_path / "answer.json"
    config.write_text(json.dumps(answer["ds_config"]))
    args = ["--model", "tiny-llama", "--gpus", "2", "--gpu-memory", "4GiB", "--cpu-memory", "64GiB",
            "--seq-len", str(answer["seq_len"]), "--ds-config", str(config)]  # fmt: skip
    if answer["activation_checkpointing"]:
        args.append("--activation-checkpointing")
    result = runner.invoke(app, ["estimate", *args, "--json"])
    assert result.exit_code == 0, result.output
    traced = json.loads(result.stdout)
    assert traced["per_gpu"] == data["per_gpu"]  # exact: what autograd saves is linear in the length (sdpa)


def test_long_context_flags_pin_the_layout_and_alst_settings() -> None:
    answer = _json(*BUILTIN, "--gpus", "8", "--sequence-parallel", "4", "--tiled-mlp", "4")["max_seq_len"]
    assert answer["sequence_parallel"] == 4 and answer["data_parallel"] == 2 and answer["tiled_mlp_shards"] == 4
    assert answer["ds_config"]["sequence_parallel_size"] == 4 and answer["ds_config"]["dstune"]["tiled_mlp_shards"] == 4
    free = _json(*BUILTIN, "--gpus", "8")["max_seq_len"]
    assert answer["candidates"] < free["candidates"]


def test_long_context_flags_reach_a_plain_estimate_and_bad_ones_exit_2() -> None:
    result = runner.invoke(app, ["estimate", *BUILTIN, "--gpus", "8", "--sequence-parallel", "3"])
    assert result.exit_code == 2 and "sequence_parallel_size" in result.output
    assert result.output.strip().count("\n") == 0
    ok = runner.invoke(app, ["estimate", *BUILTIN, "--gpus", "8", "--sequence-parallel", "2", "--json"])
    assert ok.exit_code == 0, ok.output
    assert "nccl_sequence_parallel" in json.loads(ok.stdout)["overhead_terms"]  # the Ulysses communicator


def test_the_answer_is_usable_as_given_config_out_and_what_the_code_applies(tmp_path: Path) -> None:
    """The human answer prints the ds_config to train with (``--out`` writes it), leaves the ``dstune`` keys out of
    it and says what the training code applies instead (checkpointing, ALST's pieces); ``--json`` carries the same
    in ``export``; ``--margin 5%`` (the default) leaves that much free, as ``/v1/recommend`` does."""
    out = tmp_path / "lc.json"
    args = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--gpu-memory", "64MiB"]
    human = runner.invoke(app, ["estimate", *args, "--max-seq-len"])
    assert human.exit_code == 0, human.output
    assert "the ds_config to train with" in human.output and '"train_micro_batch_size_per_gpu": 1' in human.output
    written = runner.invoke(app, ["estimate", *args, "--max-seq-len", "--out", str(out)])
    assert written.exit_code == 0 and f"wrote {out}" in written.output
    config = json.loads(out.read_text())
    assert "dstune" not in config and config["train_micro_batch_size_per_gpu"] == 1
    answer = _json(*args, "--margin", "0")
    assert answer["export"]["margin"] == 0
    if answer["max_seq_len"]["activation_checkpointing"]:
        assert "the training code applies, beside it (not DeepSpeed keys):" in human.output
        assert "gradient_checkpointing_enable" in human.output
    kept = _json(*args, "--margin", "5%")
    assert kept["export"]["ds_config"] == config
    assert kept["export"]["margin"] == 0.05 and kept["max_seq_len"]["seq_len"] <= answer["max_seq_len"]["seq_len"]
    assert kept["per_gpu"]["total"] * 1.05 <= kept["gpu_memory"]


@pytest.mark.parametrize(
    ("args", "field"),
    [(("--margin", "60%"), "margin"), (("--margin", "lots"), "margin"), (("--out", "x.json"), "out")],
)
def test_answer_options_refused_one_line(args: tuple[str, ...], field: str) -> None:
    with_max = () if field == "out" else ("--max-seq-len",)
    result = runner.invoke(app, ["estimate", *BUILTIN, *args, *with_max])
    assert result.exit_code == 2 and f"error: {field}:" in result.output, result.output
