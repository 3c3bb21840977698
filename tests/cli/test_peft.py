"""``dstune estimate --peft FILE --freeze REGEX``: the model as trained (real peft on meta), ``trainable_params``
beside ``n_params`` in ``--json``, and bad adapter configs as one line naming the field (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("peft")

from tuner.cli.app import app

runner = CliRunner()
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
BASE = ["estimate", "--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "64"]


def adapter_file(tmp_path: Path, adapter: dict) -> str:
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(adapter))
    return str(path)


def run_json(*args: str) -> dict:
    result = runner.invoke(app, [*BASE, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_reports_trainable_params_beside_n_params(tmp_path: Path) -> None:
    full = run_json("--stage", "2")
    assert full["trainable_params"] == full["n_params"]
    lora = run_json("--stage", "2", "--peft", adapter_file(tmp_path, LORA))
    # 4 layers × r·(in + out) for q_proj (128→128) and v_proj (128→64); the peft model counts them too
    assert lora["trainable_params"] == 4 * 8 * (256 + 192)
    assert lora["n_params"] == full["n_params"] + lora["trainable_params"]
    assert lora["per_gpu"]["optimizer_states"] < full["per_gpu"]["optimizer_states"] / 50
    frozen = run_json("--stage", "2", "--peft", str(tmp_path), "--freeze", "layers\\.0\\.")  # a folder works too
    assert frozen["trainable_params"] == 3 * 8 * (256 + 192)
    embed = run_json("--stage", "1", "--freeze", "embed_tokens")
    assert embed["trainable_params"] == full["n_params"] - 1024 * 128


def test_table_says_how_many_train(tmp_path: Path) -> None:
    result = runner.invoke(app, [*BASE, "--stage", "3", "--peft", adapter_file(tmp_path, LORA)])
    assert result.exit_code == 0, result.output
    assert "14,336 trainable" in result.output


@pytest.mark.parametrize(
    ("adapter", "extra", "field"),
    [
        ({**LORA, "r": 0}, [], "peft.r"),
        ({**LORA, "target_modules": ["q_prj"]}, [], "peft.target_modules"),
        ({**LORA, "peft_type": "PREFIX_TUNING"}, [], "peft.peft_type"),
        ({**LORA, "lora_rnak": 4}, [], "peft.lora_rnak"),
        (LORA, ["--freeze", "lora_"], "freeze"),
        (LORA, ["--freeze", "("], "freeze"),
    ],
)
def test_bad_adapter_is_one_line_naming_the_field(tmp_path: Path, adapter: dict, extra: list, field: str) -> None:
    result = runner.invoke(app, [*BASE, "--peft", adapter_file(tmp_path, adapter), *extra, "--json"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), result.output
    assert "Traceback" not in result.output


def test_peft_needs_a_model_config(tmp_path: Path) -> None:
    result = runner.invoke(app, ["estimate", "--params", "1e9", "--peft", adapter_file(tmp_path, LORA)])
    assert result.exit_code == 2 and result.output.startswith("error: peft"), result.output
    missing = runner.invoke(app, [*BASE, "--peft", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "peft" in missing.output, missing.output
