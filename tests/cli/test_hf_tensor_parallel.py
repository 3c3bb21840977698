"""The HF Trainer trains with AutoTP on what ``dstune best --format hf`` exports for a tp=2 trial: the ds_config as
is (``tensor_parallel.autotp_size`` kept, no ``train_batch_size``, no ParallelismConfig) and the TrainingArguments
line, on 2 gloo CPU ranks."""

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


def test_hf_trainer_trains_a_tp2_export_on_two_cpu_ranks(tmp_path: Path) -> None:
    trial = TrialConfig(
        {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": 1,  # one tensor-parallel group: one sample a step
            "tensor_parallel": {"autotp_size": 2},
            "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        }
    )
    config, notes = export_config(trial, "hf", "sdpa", None, 64)  # what `dstune best --format hf` prints
    assert "ParallelismConfig" not in "".join(note for note in notes if not note.startswith("AutoTP"))
    model = write_hf_export(tmp_path, config, notes, LLAMA)
    out = tmp_path / "trained.json"
    train_on_two_cpu_ranks(Path(__file__).with_name("hf_trainer_tp.py"), tmp_path, model, out)
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    whole = 139_584  # the tiny LLaMA's parameters (untied head)
    for rank in ranks:
        assert rank["local"] < 0.7 * whole  # AutoTP sharded attention, MLP and head
        assert len(rank["losses"]) == 2 and all(5 < loss < 7 for loss in rank["losses"])  # about ln(512)
        assert rank["train_batch_size"] == 2  # DeepSpeed's own count: every rank, though one sample trains
    assert ranks[0]["losses"] == ranks[1]["losses"]
