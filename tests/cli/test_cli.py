"""``dstune estimate``: the JSON contract, shortcut flags vs ``--ds-config``, one-line errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.workload import MAX_SEQ_LEN

runner = CliRunner()
CONTRACT_KEYS = {"n_params", "per_gpu", "cpu_per_node", "gpu_memory", "fits", "headroom"}
PER_GPU_KEYS = {"parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead", "total"}


def run_json(*args: str) -> dict:
    """Run ``dstune estimate ARGS --json`` in process and return the parsed object."""
    result = runner.invoke(app, ["estimate", *args, "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1, "--json prints exactly one line"
    return json.loads(result.stdout)


def test_json_contract_keys_and_integer_sizes() -> None:
    data = run_json("--model", "llama-2-7b", "--gpus", "8", "--stage", "3")
    assert data.keys() >= CONTRACT_KEYS
    assert data["n_params"] == 6738415616
    assert set(data["per_gpu"]) == PER_GPU_KEYS
    for key, value in data["per_gpu"].items():
        assert type(value) is int, key
    assert "total" in data["cpu_per_node"]
    assert all(type(value) is int for value in data["cpu_per_node"].values())
    for key in ("n_params", "gpu_memory", "headroom"):
        assert type(data[key]) is int, key
    assert data["gpu_memory"] == 80 * 2**30
    assert data["fits"] is True
    assert data["world_size"] == 8


def test_gpus_times_nodes_is_world_size() -> None:
    assert run_json("--model", "tiny-gpt2", "--gpus", "4", "--nodes", "2", "--stage", "2")["world_size"] == 8


def test_tight_gpu_memory_does_not_fit_with_reason() -> None:
    data = run_json("--model", "llama-2-7b", "--gpu-memory", "1GiB")
    assert data["fits"] is False
    assert data["headroom"] < 0
    assert data["gpu_memory"] == 2**30
    assert "GPU memory short" in data["reason"]


def test_bare_param_count_has_null_activations() -> None:
    data = run_json("--params", "7.5e9", "--gpus", "8", "--stage", "3")
    assert data["n_params"] == 7_500_000_000
    assert data["per_gpu"]["activations"] is None
    assert type(data["per_gpu"]["total"]) is int


def test_memory_sizes_accept_units_and_bytes() -> None:
    assert run_json("--model", "tiny-gpt2", "--gpu-memory", "512GB")["gpu_memory"] == 512 * 10**9
    assert run_json("--model", "tiny-gpt2", "--gpu-memory", "1000000000")["gpu_memory"] == 10**9
    assert run_json("--model", "tiny-gpt2", "--cpu-memory", "2TiB")["cpu_memory"] == 2 * 2**40


def test_ds_config_file_wins_over_stage_flag(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    flags = ("--model", "llama-2-7b", "--gpus", "8", "--stage", "1")
    from_flag = run_json(*flags)
    from_file = run_json(*flags, "--ds-config", str(config))
    stage3 = run_json("--model", "llama-2-7b", "--gpus", "8", "--stage", "3")
    assert from_file["per_gpu"] == stage3["per_gpu"]
    assert from_file["per_gpu"] != from_flag["per_gpu"]


def test_ds_config_merges_with_flags(tmp_path: Path) -> None:
    """A file that only sets a bucket size keeps the stage and offload given by the flags."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1000}}))
    flags = ("--model", "tiny-gpt2", "--gpus", "2", "--stage", "2", "--offload-optimizer", "cpu")
    merged = run_json(*flags, "--ds-config", str(config))
    assert merged["per_gpu"]["optimizer_states"] == 0  # still offloaded to the CPU
    assert merged["per_gpu"]["buffers"] < run_json(*flags)["per_gpu"]["buffers"]


def test_flags_reach_the_estimate() -> None:
    base = run_json("--model", "tiny-llama")
    assert (
        run_json("--model", "tiny-llama", "--micro-batch", "4")["per_gpu"]["activations"]
        > base["per_gpu"]["activations"]
    )
    assert (
        run_json("--model", "tiny-llama", "--seq-len", "4096")["per_gpu"]["activations"]
        > base["per_gpu"]["activations"]
    )
    checkpointed = run_json("--model", "tiny-llama", "--activation-checkpointing")
    assert checkpointed["per_gpu"]["activations"] < base["per_gpu"]["activations"]
    assert run_json("--model", "tiny-llama", "--device", "cpu")["per_gpu"]["overhead"] == 0
    assert (
        run_json("--model", "tiny-llama", "--precision", "fp32")["per_gpu"]["parameters"]
        == 2 * base["per_gpu"]["parameters"]
    )


def test_model_from_config_json_path(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}))
    assert run_json("--model", str(config))["n_params"] > 0


def test_table_output() -> None:
    result = runner.invoke(app, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--stage", "3"])
    assert result.exit_code == 0, result.output
    for label in (
        "parameters",
        "gradients",
        "optimizer states",
        "activations",
        "buffers",
        "overhead",
        "total",
    ):
        assert label in result.stdout
    assert "CPU per node" in result.stdout
    assert "peak phase" in result.stdout
    assert "FITS" in result.stdout


def test_table_output_does_not_fit_and_unknown_activations() -> None:
    result = runner.invoke(app, ["estimate", "--params", "7.5e9", "--gpu-memory", "1GiB"])
    assert result.exit_code == 0, result.output
    assert "unknown" in result.stdout
    assert "DOES NOT FIT" in result.stdout
    assert "GPU memory short" in result.stdout


BAD_INPUTS = [
    pytest.param(["--model", "llama-2-7b", "--stage", "4"], "stage", id="stage-4"),
    pytest.param(
        ["--model", "llama-2-7b", "--stage", "2", "--offload-param", "cpu"],
        "offload_param",
        id="offload-param-below-stage-3",
    ),
    pytest.param(
        ["--model", "llama-2-7b", "--offload-optimizer", "tape"],
        "offload-optimizer",
        id="unknown-offload-device",
    ),
    pytest.param(["--model", "llama-2-7b", "--precision", "fp8"], "precision", id="unknown-precision"),
    pytest.param(["--model", "llama-2-7b", "--gpu-memory", "80XB"], "gpu-memory", id="unknown-unit"),
    pytest.param(["--model", "llama-2-7b", "--gpu-memory", "lots"], "gpu-memory", id="unparsable-size"),
    pytest.param(["--model", "llama-2-7b", "--cpu-memory", "0"], "cpu-memory", id="zero-cpu-memory"),
    pytest.param(["--model", "llama-2-7b", "--cpu-memory", "-1GiB"], "cpu-memory", id="negative-cpu-memory"),
    pytest.param([], "model", id="neither-model-nor-params"),
    pytest.param(["--model", "llama-2-7b", "--params", "7e9"], "model", id="both-model-and-params"),
    pytest.param(["--params", "0"], "params", id="zero-params"),
    pytest.param(["--params", "-5"], "params", id="negative-params"),
    pytest.param(["--params", "inf"], "params", id="infinite-params"),
    pytest.param(["--params", "many"], "params", id="unparsable-params"),
    pytest.param(["--model", "no-such-preset"], "model", id="unknown-preset"),
    pytest.param(["--model", "missing/config.json"], "model", id="missing-model-file"),
    pytest.param(["--model", "llama-2-7b", "--gpus", "0"], "gpus", id="zero-gpus"),
    pytest.param(["--model", "llama-2-7b", "--nodes", "-1"], "nodes", id="negative-nodes"),
    pytest.param(["--model", "llama-2-7b", "--seq-len", "0"], "seq-len", id="zero-seq-len"),
    pytest.param(["--model", "llama-2-7b", "--micro-batch", "0"], "micro-batch", id="zero-micro-batch"),
    pytest.param(["--model", "llama-2-7b", "--grad-accum", "x"], "grad-accum", id="unparsable-grad-accum"),
    pytest.param(["--model", "llama-2-7b", "--attention", "magic"], "attention", id="unknown-attention"),
    pytest.param(["--model", "llama-2-7b", "--device", "tpu"], "device", id="unknown-device"),
    pytest.param(["--model", "llama-2-7b", "--ds-config", "/no/such/ds.json"], "ds-config", id="missing-ds-config"),
    pytest.param(["--model", "llama-2-7b", "--no-such-flag"], "no-such-flag", id="unknown-option"),
]


@pytest.mark.parametrize(("args", "field"), BAD_INPUTS)
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["estimate", *args, "--json"])
    assert_usage_error(result, field)


def assert_usage_error(result, field: str) -> None:
    """Exit 2, nothing on stdout, one ``error: <field>: ...`` line on stderr, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert field in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "field"),
    [
        pytest.param("{not json", "ds-config", id="malformed-json"),
        pytest.param("[1, 2]", "ds-config", id="not-an-object"),
        pytest.param('{"zero_optimization": {"stage": 4}}', "zero_optimization.stage", id="stage-4-in-file"),
        pytest.param(
            '{"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}',
            "zero_optimization.reduce_bucket_sise",
            id="misspelt-key",
        ),
        pytest.param('{"train_micro_batch_size_per_gpu": 0}', "train_micro_batch_size_per_gpu", id="zero-batch"),
        pytest.param('{"optimizer": {"type": "SGD"}}', "optimizer.type", id="unmodelled-optimizer"),
    ],
)
def test_bad_ds_config_file(tmp_path: Path, content: str, field: str) -> None:
    config = tmp_path / "ds.json"
    config.write_text(content)
    result = runner.invoke(app, ["estimate", "--model", "tiny-gpt2", "--ds-config", str(config)])
    assert_usage_error(result, field)


def test_malformed_model_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{oops")
    assert_usage_error(runner.invoke(app, ["estimate", "--model", str(config)]), "model")


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip()


def test_console_script_json() -> None:
    """The installed ``dstune`` entry point runs and prints one JSON object."""
    script = Path(sys.executable).parent / "dstune"
    if not script.exists():
        pytest.skip("dstune console script not installed next to this Python")
    done = subprocess.run(
        [str(script), "estimate", "--model", "tiny-gpt2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    data = json.loads(done.stdout)
    assert data.keys() >= CONTRACT_KEYS
    assert data["fits"] is True


def test_console_script_bad_input() -> None:
    script = Path(sys.executable).parent / "dstune"
    if not script.exists():
        pytest.skip("dstune console script not installed next to this Python")
    done = subprocess.run(
        [str(script), "estimate", "--model", "tiny-gpt2", "--stage", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert "stage" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_builds_the_same_workload_as_the_api() -> None:
    """The CLI sends its flags through the API's workload schema and to_workload: same inputs, same estimate."""
    from tuner.estimator import estimate
    from tuner.requests import WorkloadInput, to_workload
    from tuner.space.dsconfig import shortcut_config

    flags = {"gpus": 2, "nodes": 2, "gpu_memory": "24GiB", "seq_len": 256, "micro_batch": 2, "precision": "fp16"}
    cli = run_json("--model", "tiny-llama", *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items()), "--stage", "2")
    workload = to_workload(WorkloadInput(model="tiny-llama", **flags))  # the API's workload object
    api = estimate(workload, shortcut_config(2, 1, "fp16", 2, "none", "none", None)).to_dict()
    assert cli.pop("throughput")["tokens_per_s"] > 0  # the throughput prediction rides along (table constants)
    assert cli == api


def test_cli_shares_the_schema_bounds() -> None:
    assert_usage_error(runner.invoke(app, ["estimate", "--model", "tiny-gpt2", "--gpus", "5000"]), "gpus")
    assert_usage_error(
        runner.invoke(app, ["estimate", "--model", "tiny-gpt2", "--seq-len", str(MAX_SEQ_LEN + 1)]), "seq-len"
    )
    assert_usage_error(
        runner.invoke(app, ["estimate", "--model", "tiny-gpt2", "--gpu-memory", str(2**61)]), "gpu-memory"
    )


def test_model_file_is_named_by_its_folder_where_that_names_the_model(tmp_path: Path) -> None:
    """``--model`` reads the file and names the model after its folder where the folder names the model type, whatever
    its ``_name_or_path`` says; a folder that does not (the hub cache's snapshot hash) gives way to
    ``_name_or_path``."""
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "_name_or_path": "hub/other"}
    for name, label in (("my-gpt2", "my-gpt2"), ("0e9e39f2", "other")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        result = runner.invoke(app, ["estimate", "--model", str(folder)])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"{label} (GPT2LMHeadModel): ")  # the label, the architecture


def test_bad_value_in_model_file_names_the_model_key(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 65, "n_layer": 2, "n_head": 4}))
    result = runner.invoke(app, ["estimate", "--model", str(config)])
    assert_usage_error(result, "model.n_head")


def test_the_overhead_is_shown_as_named_terms() -> None:
    data = run_json("--model", "llama-2-7b", "--gpus", "8", "--nodes", "2", "--stage", "3")
    terms = data["overhead_terms"]
    assert {"cuda_context", "nccl_world", "nccl_data_parallel", "cublas_workspace", "allocator_reserve"} == set(terms)
    assert sum(terms.values()) == data["per_gpu"]["overhead"]
    table = runner.invoke(app, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--stage", "3"])
    assert table.exit_code == 0 and "nccl data parallel" in table.stdout and "allocator reserve" in table.stdout
    assert run_json("--model", "tiny-llama", "--device", "cpu")["overhead_terms"] == {}


def test_a_thread_budget_too_small_for_one_thread_per_rank_is_refused(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'x.db'}"
    args = ["tune", "--model", "tiny-gpt2", "--seq-len", "64", "--gpus", "2"]
    args += ["--search-threads", "--cores-per-node", "1"]
    result = CliRunner().invoke(app, [*args, "--storage", storage, "--launcher", "local"])
    assert result.exit_code == 2 and "cores-per-node" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x.db").exists()  # refused before a study was written


@pytest.mark.parametrize("command", ["tune", "measure"])
def test_a_sequence_past_the_models_learned_positions_is_refused(tmp_path: Path, command: str) -> None:
    """tiny-gpt2 learned 256 positions; the default 2048 tokens would fail every run with an IndexError."""
    storage = ["--storage", f"sqlite:///{tmp_path / 'x.db'}"] if command == "tune" else []
    args = [command, "--model", "tiny-gpt2", "--gpus", "2", "--device", "cpu", "--launcher", "local", *storage]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "seq-len" in result.output and "256 positions" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x.db").exists()


def test_a_sequence_past_the_learned_positions_is_an_estimate_only() -> None:
    """tiny-gpt2 learned 256 positions (``wpe``): at 4,096 tokens every step would index past the table, which no
    RoPE scaling extends. The estimate still comes (the bytes are what they are) but says it is an estimate only,
    naming the limit; at the table's length it does not."""
    beyond = run_json("--model", "tiny-gpt2", "--seq-len", "4096")
    assert beyond["estimate_only"] is True and "256 positions" in beyond["estimate_only_why"]
    within = run_json("--model", "tiny-gpt2", "--seq-len", "256")
    assert within["estimate_only"] is False
    shown = runner.invoke(app, ["estimate", "--model", "tiny-gpt2", "--seq-len", "4096"])
    assert shown.exit_code == 0 and "ESTIMATE ONLY" in shown.output and "--seq-len 256" in shown.output
