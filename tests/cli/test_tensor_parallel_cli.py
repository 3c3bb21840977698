"""``dstune estimate --ds-config`` with AutoTP and hpZ: per-rank figures, and bad layouts as one line naming the
field (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

runner = CliRunner()


def estimate_json(tmp_path: Path, ds: dict, *flags: str) -> dict:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    result = runner.invoke(app, ["estimate", "--model", "llama-2-7b", *flags, "--ds-config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def ds_config(tp: int = 1, stage: int = 3, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, **zero},
        "tensor_parallel": {"autotp_size": tp},
    }


def test_autotp_and_hpz_give_per_rank_figures(tmp_path: Path) -> None:
    flags = ("--gpus", "8", "--nodes", "2")
    plain = estimate_json(tmp_path, ds_config(), *flags)
    tp = estimate_json(tmp_path, ds_config(tp=2), *flags)
    assert tp["n_params"] == plain["n_params"] == 6_738_415_616
    # ZeRO-3 over 16 / 2 = 8 data-parallel ranks of each rank's half-sharded model: optimizer states about the same
    assert tp["per_gpu"]["optimizer_states"] == pytest.approx(plain["per_gpu"]["optimizer_states"], rel=0.03)
    assert 3.3e9 < tp["details"]["tp_local_elements"] < 3.5e9
    assert tp["per_gpu"]["activations"] < 0.75 * plain["per_gpu"]["activations"]
    assert "nccl_tensor_parallel" in tp["overhead_terms"]
    # hpZ's secondary partition of the model over groups of 8, in bf16 (the step's: all released)
    hpz = estimate_json(tmp_path, ds_config(zero_hpz_partition_size=8), *flags)
    assert hpz["details"]["hpz_secondary_partition"] == pytest.approx(2 * hpz["n_params"] / 8, rel=1e-3)
    assert "nccl_hpz" in hpz["overhead_terms"]


@pytest.mark.parametrize(
    ("ds", "field"),
    [
        (ds_config(tp=3), "tensor_parallel.autotp_size"),
        (ds_config(tp=16), "tensor_parallel.autotp_size"),  # 8 GPUs a node
        (ds_config(stage=2, zero_hpz_partition_size=2), "zero_optimization.zero_hpz_partition_size"),
        # DeepSpeed 0.19.8 groups hpZ over a tensor-parallel group's ranks: wrong gradients (measured)
        (ds_config(tp=2, zero_hpz_partition_size=8), "zero_optimization.zero_hpz_partition_size"),
    ],
)
def test_bad_layouts_exit_2_naming_the_field(tmp_path: Path, ds: dict, field: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    result = runner.invoke(app, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--ds-config", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], result.stderr


def test_the_layout_flags_give_the_ds_config_figures(tmp_path: Path) -> None:
    """``--tensor-parallel`` and ``--hpz`` write the same keys as a ``--ds-config`` does."""
    flags = ("--gpus", "8", "--nodes", "2", "--micro-batch", "1", "--stage", "3")

    def flagged(*more: str) -> dict:
        result = runner.invoke(app, ["estimate", "--model", "llama-2-7b", *flags, *more, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    tp = flagged("--tensor-parallel", "2")
    same = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
            "tensor_parallel": {"autotp_size": 2}}  # fmt: skip
    assert tp["per_gpu"] == estimate_json(tmp_path, same, *flags)["per_gpu"]
    hpz = flagged("--hpz", "8")
    assert hpz["details"]["hpz_secondary_partition"] == pytest.approx(2 * hpz["n_params"] / 8, rel=1e-3)
    both = runner.invoke(app, ["estimate", "--model", "llama-2-7b", *flags, "--tensor-parallel", "2", "--hpz", "8"])
    assert both.exit_code == 2 and "zero_optimization.zero_hpz_partition_size" in both.stderr


def test_tune_checks_hpz_against_the_ranks_before_any_run_and_pins_it(tmp_path: Path) -> None:
    """``--hpz`` pins the space's hpz_partition_size; its stage is searched (a trial at another stage is pruned
    naming the pin), so the check before any run is the ranks only."""
    from tuner.cli.options import WorkloadFlags
    from tuner.cli.tune import _long_context_pins

    layouts = {"sequence_parallel": None, "tensor_parallel": 2, "expert_parallel": None, "hpz_partition_size": None}
    pins = _long_context_pins(WorkloadFlags(layouts=layouts, tiled_mlp=None, tiled_loss=None, offload_checkpoints=None))
    assert pins == {"tensor_parallel": 2}
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ["tune", "--model", "llama-2-7b", "--gpus", "2", "--device", "cpu", "--hpz", "4", "--storage", storage]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "zero_optimization.zero_hpz_partition_size" in result.stderr, result.output
    assert "must divide the 2 ranks" in result.stderr


@pytest.mark.parametrize(
    ("flags", "pin", "why"),
    [
        (["--model-impl", "builtin", "--tensor-parallel", "2"], "tensor_parallel", "needs the transformers model"),
        (["--pin", "zero_optimization.zero_quantized_weights=true"], "quantized_weights", "QuantizerBuilder needs"),
    ],
)
def test_a_pin_no_run_can_measure_exits_2_at_start_naming_it(tmp_path: Path, flags: list, pin: str, why: str) -> None:
    """A pin overrides the space's conditions on the workload; one that no run of the workload can measure is refused
    before the study writes anything, naming the pin, not every trial pruned with the space's condition."""
    from tuner.storage import Store

    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ["tune", "--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "64", "--study", "s"]
    result = runner.invoke(app, [*args, "--storage", storage, *flags])
    assert result.exit_code == 2, result.output
    assert f"pins.{pin}: pinned to" in result.stderr and why in result.stderr
    assert Store.open(storage).get_study("s") is None
