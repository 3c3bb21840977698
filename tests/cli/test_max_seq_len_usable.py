"""The ``--max-seq-len`` answer as a user takes it: the margin both faces default to, the next limit naming what
stopped the answer (the margin, a learned position table), and ``--out`` writing the ds_config (DeepSpeed keys only)
with the code-side settings in a file of their own beside it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.cli.app import app
from tuner.forecast import DEFAULT_MARGIN

runner = CliRunner()
LLAMA = ("--model", "llama-2-7b", "--model-impl", "builtin")
TINY = ("--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--gpu-memory", "64MiB")


def _answer(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", *args, "--max-seq-len", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def client(tmp_path: Path):
    application = create_app(f"sqlite:///{tmp_path / 'api.db'}", "tok", recommend_cache_s=0, request_budget_s=600)
    with TestClient(application) as test_client:
        yield test_client


def test_the_default_margin_is_the_apis_on_both_faces(client: TestClient) -> None:
    """Without --margin the answer keeps DEFAULT_MARGIN free (0.00 GiB of headroom is no answer to train with), as
    /v1/estimate's seq_len max does by default; --margin 0 is the estimate's own limit, and longer."""
    default, raw = _answer(*LLAMA), _answer(*LLAMA, "--margin", "0")
    assert default["export"]["margin"] == default["max_seq_len"]["margin"] == DEFAULT_MARGIN == 0.05
    assert default["per_gpu"]["total"] * (1 + DEFAULT_MARGIN) <= default["gpu_memory"]
    assert raw["max_seq_len"]["margin"] == 0 and raw["max_seq_len"]["seq_len"] > default["max_seq_len"]["seq_len"]
    body = {"model": "llama-2-7b", "model_impl": "builtin", "seq_len": "max"}
    api = client.post("/v1/estimate", json={"workload": body}, headers={"Authorization": "Bearer tok"})
    assert api.status_code == 200, api.text
    assert api.json()["max_seq_len"] == default["max_seq_len"]
    api_raw = client.post("/v1/estimate", json={"workload": body, "margin": 0}, headers={"Authorization": "Bearer tok"})
    assert api_raw.json()["max_seq_len"] == raw["max_seq_len"]


def test_a_margin_outside_seq_len_max_is_refused_at_its_field(client: TestClient) -> None:
    body = {"workload": {"model": "gpt2", "seq_len": 1024}, "margin": 0.1}
    response = client.post("/v1/estimate", json=body, headers={"Authorization": "Bearer tok"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"][-1] == "margin" and 'seq_len "max"' in detail["msg"], detail


def test_the_next_limit_under_a_margin_names_the_margin() -> None:
    """One step past a margined answer the GPU may still hold the peak: the limit is the margin, with the bytes it
    misses by, not "GPU memory runs out, 0.00 GiB short"."""
    result = runner.invoke(app, ["estimate", *LLAMA, "--max-seq-len", "--margin", "10%"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "0.00 GiB short" not in text
    limit = _answer(*LLAMA, "--margin", "10%")["max_seq_len"]["next_limit"]
    assert limit["memory"] == "gpu" and limit["short_by"] > 0 and "10% margin" in limit["reason"]


def test_a_learned_position_table_stops_the_answer_and_says_so() -> None:
    """GPT-2 cannot index past its 1,024 learned positions (no RoPE scaling extends them): the answer stops there,
    its next limit is the table, and no note tells the user to extend the positions."""
    answer = _answer("--model", "gpt2", "--model-impl", "builtin")["max_seq_len"]
    assert answer["seq_len"] == 1024 and not answer["beyond_max_positions"]
    assert answer["next_limit"]["memory"] == "positions" and "1,024 positions" in answer["next_limit"]["reason"]
    assert not any("RoPE" in note for note in answer["notes"])
    human = runner.invoke(app, ["estimate", "--model", "gpt2", "--model-impl", "builtin", "--max-seq-len"])
    assert "learned position table" in human.output


def test_out_writes_deepspeed_keys_and_the_code_side_settings_beside_them(tmp_path: Path) -> None:
    """``--out lc.json``: lc.json holds what DeepSpeed reads; lc.training-code.json the settings the training code
    applies (checkpointing, the dstune section: ALST's shards, checkpoint offload) and the steps, as --json's
    export.training_code carries them."""
    out = tmp_path / "lc.json"
    pins = ("--tiled-mlp", "4", "--activation-checkpointing")
    result = runner.invoke(app, ["estimate", *TINY, *pins, "--max-seq-len", "--out", str(out)])
    assert result.exit_code == 0, result.output
    code_file = tmp_path / "lc.training-code.json"
    assert f"wrote {code_file}" in " ".join(result.output.split())
    config, code = json.loads(out.read_text()), json.loads(code_file.read_text())
    assert "dstune" not in config and "activation_checkpointing" not in config
    assert code["dstune"]["tiled_mlp_shards"] == 4 and code["activation_checkpointing"] is True
    assert any("TiledMLP.apply" in step for step in code["apply"])
    assert any("gradient_checkpointing_enable" in step for step in code["apply"])
    arctic = code["arctic_training"]  # ArcticTraining's names for the same pieces
    assert arctic["tiled_mlp_compute"] is True and arctic["data"]["max_length"] == code["seq_len"]
    assert arctic["sequence_parallel_size"] == config.get("sequence_parallel_size", 1)
    assert "tiled_mlp_compute: true" in result.output
    answer = _answer(*TINY, *pins)
    assert answer["export"]["ds_config"] == config and code["seq_len"] == answer["max_seq_len"]["seq_len"]
    named = ("about", "again")  # they name the file the config went to: ds_config.json without --out
    assert {k: v for k, v in answer["export"]["training_code"].items() if k not in named} == {
        k: v for k, v in code.items() if k not in named
    }


@pytest.mark.parametrize("name", ["lc.json", "lc.training-code.json"])
def test_out_never_writes_over_a_file_that_is_no_config(tmp_path: Path, name: str) -> None:
    """Either file of ``--out lc.json`` naming a script (not JSON) is refused before the search, exit 2 naming
    ``out``, and nothing is written."""
    (tmp_path / name).write_text("import deepspeed\n")
    out = tmp_path / "lc.json"
    result = runner.invoke(app, ["estimate", *TINY, "--max-seq-len", "--out", str(out)])
    assert result.exit_code == 2 and "error: out:" in result.output, result.output
    assert (tmp_path / name).read_text() == "import deepspeed\n"
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("gpus", ["1", "8"])
def test_the_written_config_and_the_again_flags_estimate_the_answer_again(tmp_path: Path, gpus: str) -> None:
    """The written ds_config holds only DeepSpeed's keys; with the flags the answer prints (``again``: the length,
    checkpointing, ALST's shards, checkpoint offload) ``dstune estimate`` gives the answer's own estimate, byte for
    byte; without them (the config alone) it does not fit, which is why they are printed."""
    out = tmp_path / "lc.json"
    model = (*LLAMA, "--gpus", gpus)
    result = runner.invoke(app, ["estimate", *model, "--max-seq-len", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    again = shlex.split(answer["export"]["training_code"]["again"])
    assert again[:4] == ["--seq-len", str(answer["max_seq_len"]["seq_len"]), "--ds-config", str(out)]
    assert json.loads((tmp_path / "lc.training-code.json").read_text())["again"] == shlex.join(again)
    redone = runner.invoke(app, ["estimate", *model, *again, "--json"])
    assert redone.exit_code == 0, redone.output
    assert json.loads(redone.stdout)["per_gpu"] == answer["per_gpu"]
    bare = runner.invoke(app, ["estimate", *model, *again[:4], "--json"])
    assert bare.exit_code == 0 and json.loads(bare.stdout)["fits"] is False
