"""Liger-Kernel's kernels in the estimate (``--liger``, ``dstune.liger_kernel``): its layer, its fused linear
cross-entropy (no logits), and the refusals, through ``dstune estimate`` and ``/v1/estimate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.api import create_app
from tuner.cli.app import app
from tuner.estimator.activations.liger import liger_backward_peaks, liger_layer_saved, liger_loss
from tuner.workload import load_builtin_model

runner = CliRunner()
# the built-in LLaMA on a CUDA cluster (estimate only): the formula's activations, Liger's in their place
LLAMA = ["--model", "tiny-llama", "--model-impl", "builtin", "--gpus", "1", "--seq-len", "4096", "--stage", "2"]


def estimate(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", *LLAMA, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_liger_layers_and_loss_replace_hugging_faces() -> None:
    model = load_builtin_model("tiny-llama")
    plain, liger = estimate(), estimate("--liger")
    assert liger["details"]["liger_layer_saved"] == liger_layer_saved(model, 1, 4096, 2)
    changed, workspace = liger_loss(model, 4096, 2)
    assert liger["details"]["liger_loss_saved"] == changed < 0  # no fp32 log-softmax of the logits
    assert liger["details"]["logits_workspace"] == workspace < plain["details"]["logits_workspace"]
    forward = [answer["phases"]["forward"]["gpu"] for answer in (liger, plain)]  # the loss's moment
    assert forward[0] < forward[1]


def test_the_recomputed_layer_under_checkpointing_is_ligers() -> None:
    model = load_builtin_model("tiny-llama")
    liger = estimate("--liger", "--activation-checkpointing")
    peak, outside_mlp = liger_backward_peaks(model, 1, 4096, 2)
    assert liger["details"]["recomputed_backward_peak"] == peak > liger_layer_saved(model, 1, 4096, 2)
    assert outside_mlp <= peak


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--device", "cpu"], id="cpu-ranks"),
        pytest.param(["--tiled-loss", "4"], id="tiled-loss"),
        pytest.param(["--chunked-loss"], id="chunked-loss"),
        pytest.param(["--model", "tiny-gpt2"], id="not-a-liger-model"),
    ],
)
def test_refused_one_line_naming_the_key(args: list[str]) -> None:
    result = runner.invoke(app, ["estimate", *LLAMA, "--liger", *args, "--json"])
    assert_usage_error(result, "dstune.liger_kernel")


def test_api_estimate_takes_liger(tmp_path: Path) -> None:
    api = create_app(f"sqlite:///{tmp_path / 'dstune.db'}", "t", recommend_cache_s=0, request_budget_s=600)
    workload = {"model": "tiny-llama", "model_impl": "builtin", "seq_len": 4096}
    with TestClient(api, headers={"Authorization": "Bearer t"}) as client:
        answer = client.post("/v1/estimate", json={"workload": workload, "stage": 2, "liger": True})
        refused = client.post("/v1/estimate", json={"workload": {**workload, "device": "cpu"}, "liger": True})
    assert answer.status_code == 200, answer.text
    assert "liger_layer_saved" in answer.json()["details"]
    assert refused.status_code == 422 and "liger_kernel" in refused.text


def test_the_longest_sequence_search_keeps_the_numerics_flags() -> None:
    """``--max-seq-len`` with ``--liger`` searches configs with Liger's kernels (no tiled loss beside them), and with
    ``--bf16-master-weights --bf16-optimizer-states`` configs with them (the flags were dropped before)."""
    base = ["--model", "tiny-llama", "--model-impl", "builtin", "--gpus", "1", "--gpu-memory", "4GiB", "--stage", "2"]
    for flags, section, expected in (
        (["--liger"], "dstune", {"liger_kernel": True}),
        (["--bf16-master-weights", "--bf16-optimizer-states"], "bf16", {"bf16_optimizer_states": True}),
    ):
        result = runner.invoke(app, ["estimate", *base, *flags, "--max-seq-len", "--json"])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)["max_seq_len"]
        assert expected.items() <= answer["ds_config"][section].items()
        assert section != "dstune" or answer["tiled_loss_shards"] == 1
