"""The first recomputed layer's moment (:mod:`tuner.estimator.activations.first_recompute`): the other layers'
checkpoints held beside the last layer's recomputation, in the backward phase (measured: ``bench/first_recompute.py``,
the true backward peak rising by one checkpoint per layer)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.workload import load_builtin_model

runner = CliRunner()
# the built-in LLaMA (estimate only), one H100, ZeRO-3 with the optimizer offloaded (no gradients on the device)
BASE = ["estimate", "--model", "tiny-llama", "--model-impl", "builtin", "--seq-len", "65536", "--stage", "3"]
BASE += ["--offload-optimizer", "cpu", "--offload-param", "cpu", "--activation-checkpointing", "--json"]


def answer(*args: str) -> dict:
    result = runner.invoke(app, [*BASE, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_other_checkpoint_is_held_while_the_last_layer_is_recomputed() -> None:
    plain, liger = answer(), answer("--liger")
    for found in (plain, liger):
        model = load_builtin_model("tiny-llama")
        checkpoint = 2 * 65536 * model.hidden_size  # bf16 layer input
        assert found["details"]["first_recompute_checkpoints"] == (model.num_layers - 1) * checkpoint
    backward = liger["phases"]["backward"]["gpu"]
    assert backward >= liger["details"]["recomputed_block"] + liger["details"]["first_recompute_checkpoints"]


def test_offloaded_checkpoints_leave_one_beside_it() -> None:
    """ALST's offloaded checkpoints: only the next one, copied back, is on the device beside the recomputed layer."""
    found = answer("--offload-checkpoints")
    assert found["details"]["first_recompute_checkpoints"] == 2 * 65536 * load_builtin_model("tiny-llama").hidden_size


def test_without_checkpointing_nothing_is_added() -> None:
    result = runner.invoke(app, [*BASE[:-2], "--no-activation-checkpointing", "--json"])
    assert result.exit_code == 0, result.output
    assert "first_recompute_checkpoints" not in json.loads(result.stdout)["details"]
