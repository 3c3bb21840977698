"""A config's layers in all are bounded before any model is built (tuner.workload.config_depth): a deep model whose
every layer count is within its own bound (a tiny Mixtral of 512 layers, an encoder and a decoder of 300 each, a
nested text model) is refused naming the largest count, on the API (422) and the CLI (exit 2, one line), and every
transformers config class's defaults and every preset pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.requests import FieldError, WorkloadRequest, check_request
from tuner.workload.config_bounds import MAX_LAYERS
from tuner.workload.config_depth import MAX_TOTAL_LAYERS, check_depth

TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 4, "vocab_size": 512, "num_local_experts": 8, "num_experts_per_tok": 2,
                "num_hidden_layers": 512}  # fmt: skip
DEEP: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    (TINY_MIXTRAL, ("num_hidden_layers",)),
    ({"model_type": "bart", "encoder_layers": 300, "decoder_layers": 300, "d_model": 64}, ("encoder_layers",)),
    ({"model_type": "t5", "num_layers": 200, "num_decoder_layers": 200}, ("num_layers",)),
    (
        {"model_type": "llava", "text_config": {"num_hidden_layers": 200}, "vision_config": {"depth": 100}},
        ("text_config", "num_hidden_layers"),
    ),
    ({"model_type": "x", "n_recurrent_layers": 150, "n_output_layers": 150}, ("n_recurrent_layers",)),  # unseen
    ({"model_type": "x", "num_decoder_blocks": 257}, ("num_decoder_blocks",)),
]


@pytest.mark.parametrize(("config", "field"), DEEP)
def test_a_deep_config_is_refused_naming_its_largest_layer_count(config: dict, field: tuple[str, ...]) -> None:
    assert all(count <= MAX_LAYERS for count in _counts(config))  # each count alone passes its own bound
    with pytest.raises(FieldError) as error:
        check_request(WorkloadRequest(config=config), ("workload",))
    assert error.value.loc == ("workload", "config", *field)
    assert f"at most {MAX_TOTAL_LAYERS}" in error.value.message and "layers in all" in error.value.message


def _counts(config: dict) -> list[int]:
    found = []
    for value in config.values():
        found += _counts(value) if isinstance(value, dict) else [value] if isinstance(value, int) else []
    return found


def test_indices_and_thresholds_are_not_counts() -> None:
    check_depth({"num_hidden_layers": 80, "max_window_layers": 80, "kv_source_layers": list(range(200)),
                 "first_k_dense_replace": 200, "sliding_window_layers": 200})  # fmt: skip


def test_every_transformers_config_class_and_every_preset_passes() -> None:
    from transformers import CONFIG_MAPPING

    from tuner.workload import preset_config
    from tuner.workload.hf_config import PRESET_DIR

    for name in CONFIG_MAPPING:
        try:
            defaults = json.loads(json.dumps(CONFIG_MAPPING[name]().to_dict(), default=str))
        except Exception:  # a config class that cannot be made with no arguments has no defaults to check
            continue
        check_depth(defaults)
    for preset in PRESET_DIR.glob("*.json"):
        check_depth(preset_config(preset.stem))


def test_the_api_refuses_it_with_422_before_any_work(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from tuner.api import create_app

    with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}", None)) as client:
        for path in ("/v1/estimate", "/v1/recommend"):
            answer = client.post(path, json={"workload": {"config": TINY_MIXTRAL, "seq_len": "max"}})
            assert answer.status_code == 422, answer.text
            assert answer.json()["detail"][0]["loc"] == ["body", "workload", "config", "num_hidden_layers"]


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_MIXTRAL))
    result = CliRunner().invoke(app, ["estimate", "--model", str(config), "--gpus", "1", "--seq-len", "128"])
    assert result.exit_code == 2, result.output
    assert "num_hidden_layers" in result.output and f"at most {MAX_TOTAL_LAYERS}" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
