"""``--quantization FILE`` (a 4-bit bitsandbytes base, QLoRA): ``dstune estimate --device cuda`` marks it estimate
only (a line in the table, ``estimate_only`` in ``--json``); on CPU, and in ``measure`` and ``tune`` before any run,
it is one line naming the field, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("peft")

from tuner.cli.app import app

runner = CliRunner()
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
MODEL = ["--model", "tiny-llama", "--gpus", "2", "--seq-len", "64"]


def files(tmp_path: Path, quantization: dict = NF4) -> list[str]:
    (tmp_path / "adapter_config.json").write_text(json.dumps(LORA))
    (tmp_path / "bnb.json").write_text(json.dumps(quantization))
    return ["--peft", str(tmp_path / "adapter_config.json"), "--quantization", str(tmp_path / "bnb.json")]


def one_error_line(args: list[str], field: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.output
    return lines[0]


def test_estimate_json_and_table_say_estimate_only(tmp_path: Path) -> None:
    args = ["estimate", *MODEL, "--device", "cuda", "--stage", "2", *files(tmp_path)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["estimate_only"] is True and "bitsandbytes" in data["estimate_only_why"]
    assert data["details"]["quantized_weights"] == 362_496 + 47_104  # packed 4-bit data + quant state
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "ESTIMATE ONLY" in table.output, table.output
    plain = runner.invoke(app, ["estimate", *MODEL, "--device", "cuda", "--peft", files(tmp_path)[1], "--json"])
    assert json.loads(plain.output)["estimate_only"] is False


def test_qlora_on_cpu_is_one_line_exit_2(tmp_path: Path) -> None:
    line = one_error_line(["estimate", *MODEL, "--device", "cpu", *files(tmp_path), "--json"], "quantization")
    assert "CUDA" in line


@pytest.mark.parametrize("command", ["measure", "tune"])
def test_measure_and_tune_refuse_before_any_run(tmp_path: Path, command: str) -> None:
    extra = ["--storage", f"sqlite:///{tmp_path}/d.db", "--trials", "1"] if command == "tune" else []
    one_error_line([command, *MODEL, "--device", "cpu", *files(tmp_path), *extra], "quantization")


def test_bad_quantization_file_names_the_field(tmp_path: Path) -> None:
    bad = {**NF4, "bnb_4bit_quant_storage": "int32"}
    one_error_line(["estimate", *MODEL, *files(tmp_path, bad)], "quantization.bnb_4bit_quant_storage")
    without_peft = ["estimate", *MODEL, "--quantization", files(tmp_path)[3]]
    one_error_line(without_peft, "quantization")


@pytest.mark.parametrize("command", ["estimate", "measure"])
def test_zero_quantized_nontrainable_weights_on_cpu_is_one_line(tmp_path: Path, command: str) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True}}))
    args = [command, *MODEL, "--device", "cpu", "--peft", files(tmp_path)[1], "--ds-config", str(config)]
    one_error_line(args, "zero_optimization.zero_quantized_nontrainable_weights")
