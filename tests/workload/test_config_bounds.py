"""Every dimension a config can carry is bounded by its name's shape (tuner.workload.config_bounds): the names of
encoder-decoder, state-space and MLA models too, refused in the request (422) and the CLI (exit 2) before any
build; transformers' own defaults pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.requests import FieldError, WorkloadRequest, check_request
from tuner.workload.hf_config import check_config_limits

HOSTILE = [
    ("bart", "decoder_layers", 10**6),
    ("bart", "encoder_layers", 10**6),
    ("bart", "decoder_ffn_dim", 10**9),
    ("bart", "decoder_attention_heads", 10**7),
    ("mamba", "state_size", 10**9),
    ("mamba", "expand", 10**9),
    ("mamba", "time_step_rank", 10**9),
    ("mamba2", "n_groups", 10**7),
    ("deepseek_v3", "v_head_dim", 10**9),
    ("deepseek_v3", "qk_rope_head_dim", 10**9),
    ("t5", "d_ff", 10**9),
    ("t5", "num_decoder_layers", 10**6),
    ("whisper", "decoder_layers", 10**6),
]
FAMILIES = sorted({family for family, _, _ in HOSTILE} | {"jamba", "qwen3_moe", "llama", "gpt2"})


@pytest.mark.parametrize(("family", "key", "value"), HOSTILE)
def test_a_dimension_out_of_bounds_is_refused_naming_it(family: str, key: str, value: int) -> None:
    with pytest.raises(FieldError) as error:
        check_request(WorkloadRequest(config={"model_type": family, key: value}), ("workload",))
    assert error.value.loc == ("workload", "config", key) and "at most" in error.value.message


def test_nested_and_listed_dimensions_are_bounded_too() -> None:
    with pytest.raises(Exception, match=r"model.text_config.decoder_layers"):
        check_config_limits({"model_type": "x", "text_config": {"decoder_layers": 10**6}})
    with pytest.raises(Exception, match=r"model.hidden_sizes: must be at most"):
        check_config_limits({"model_type": "x", "hidden_sizes": [64, 10**9]})


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_defaults_pass(family: str) -> None:
    from transformers import CONFIG_MAPPING

    check_config_limits(json.loads(json.dumps(CONFIG_MAPPING[family]().to_dict(), default=str)))


def test_the_cli_refuses_a_huge_decoder_before_building_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bart", "decoder_layers": 10**6, "vocab_size": 1000}))
    result = CliRunner().invoke(app, ["estimate", "--model", str(config), "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "decoder_layers" in result.output and "at most 1024" in result.output
