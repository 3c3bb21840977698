"""The HF Trainer trains with Ulysses sequence parallelism on what ``dstune best --format hf`` exports for an sp=2
trial: the ds_config as is, the TrainingArguments line, and the printed ParallelismConfig executed as printed (2 gloo
CPU ranks; the script adds ``deepspeed.init_distributed``, which accelerate leaves to the script on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

from hf_launch import train_on_two_cpu_ranks, write_hf_export
from tiny_configs import SP_LLAMA as LLAMA

from tuner.space.dsconfig import export_config
from tuner.workload import TrialConfig

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]


def test_hf_trainer_trains_an_sp2_export_on_two_cpu_ranks(tmp_path: Path) -> None:
    trial = TrialConfig(
        {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": 1,
            "sequence_parallel_size": 2,
            "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        }
    )
    config, notes = export_config(trial, "hf", "sdpa", None, 64)  # what `dstune best --format hf` prints
    model = write_hf_export(tmp_path, config, notes, LLAMA)
    out = tmp_path / "trained.json"
    train_on_two_cpu_ranks(Path(__file__).with_name("hf_trainer_sp.py"), tmp_path, model, out)
    result = json.loads(out.read_text())
    assert result["steps"] == 3 and len(result["losses"]) == 3
    assert all(5 < loss < 7 for loss in result["losses"])  # about ln(512) = 6.24 for random weights
    assert result["changed"] == result["params"]  # every weight trained
