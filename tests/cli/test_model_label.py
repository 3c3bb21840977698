"""A ``config.json`` model is named by what it is, not by the folder it sits in."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from tuner.cli.app import app

CONFIG = Path(__file__).resolve().parents[2] / "bench" / "configs" / "llama-3.1-8b" / "config.json"


def test_a_config_in_a_folder_named_otherwise_is_labelled_by_its_model_type(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    shutil.copy(CONFIG, tmp_path / "cfg" / "config.json")
    args = ["estimate", "--gpus", "8", "--model-impl", "builtin", "--model"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "cfg" / "config.json")])
    assert result.exit_code == 0 and result.output.startswith("llama ("), result.output[:200]
    named = CliRunner().invoke(app, [*args, str(CONFIG.parent)])
    assert named.output.startswith("llama-3.1-8b ("), named.output[:200]
