"""The estimate beside a command's run reads the HF Trainer's ``"auto"`` ZeRO buckets as the Trainer and accelerate
fill them (from the model's hidden size h: ``reduce_bucket_size`` h²), not as DeepSpeed's default 5e8 elements:
run_clm.py's ZeRO-2 run with the HF docs' config measured a 2.8 MB peak per rank against a 2.00 GB estimate, the
whole of it the default bucket the Trainer never allocated."""

from __future__ import annotations

from tuner.cli.options import WorkloadFlags, build
from tuner.measure.script.estimate_note import script_estimate
from tuner.workload import TrialConfig

AUTO = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "train_batch_size": 2,
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
}


def test_an_auto_reduce_bucket_is_estimated_at_the_hidden_size_squared() -> None:
    workload, _ = build(WorkloadFlags(model="tiny-llama", gpus=2, device="cpu", seq_len=64, precision="fp32"))
    hidden = workload.model.hidden_size
    auto, _ = script_estimate(workload, TrialConfig(AUTO))
    given = {**AUTO, "zero_optimization": {"stage": 2, "reduce_bucket_size": hidden * hidden}}
    filled, _ = script_estimate(workload, TrialConfig(given))
    assert auto is not None and filled is not None
    assert auto["per_gpu"] == filled["per_gpu"] and auto["details"]["reduce_buckets"] < 10_000_000
