"""The estimator with a LoRA adapter against real DeepSpeed on 2 CPU ranks (gloo, bf16), so that it cannot drift.

Each case trains a tiny LLaMA-style model with peft's LoRA on q_proj and v_proj for two steps (the rank function
of ``bench/peft_memory.py``: the adapter added after the base is built, only trainable parameters given to the
optimizer) and compares, for the worst rank: the trainable count with DeepSpeed's, the model states the engine and
optimizer hold (live storages, :func:`tuner.measure.memory_probe.classify_engine_memory`) within 1 %, and the true
peak of live tensor bytes (the allocator's records, :mod:`tuner.measure.true_peak`) within 5 %. Small reduce
buckets, so that states and activations, not a 1 GB bucket, set the peak.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peft_memory

from tuner.estimator import estimate

pytestmark = pytest.mark.deepspeed


@pytest.mark.parametrize("stage", [1, 2])
def test_lora_estimate_matches_deepspeed(stage: int) -> None:
    work = peft_memory.workload("tiny-llama")
    config = peft_memory.ds_config(stage, peft_memory.VARIANTS["small_buckets"])
    ranks = peft_memory.measure(work, config)
    est = estimate(work, config)
    assert est.trainable_params == ranks[0]["trainable_numel"] == 4 * 8 * (256 + 192)
    held = max(peft_memory.model_states(r["held"]) for r in ranks)
    assert abs(peft_memory.estimated_states(est) / held - 1) < 0.01
    true = max(r["true_peak_bytes"] for r in ranks)
    assert abs((est.per_gpu["total"] or 0) / true - 1) < 0.05


def test_lora_zero3_model_states_match_deepspeed() -> None:
    """ZeRO-3: frozen weights partitioned, small parameters (all the adapters) persistent and whole, peft's fp32
    adapters kept fp32. The peak is not yet within 5 % here (see bench/results/peft_memory.md)."""
    work = peft_memory.workload("tiny-llama")
    config = peft_memory.ds_config(3, peft_memory.VARIANTS["small_buckets"])
    ranks = peft_memory.measure(work, config)
    est = estimate(work, config)
    held = max(peft_memory.model_states(r["held"]) for r in ranks)
    assert abs(peft_memory.estimated_states(est) / held - 1) < 0.01
    assert ranks[0]["param_elements"]["trainable_float32"] == est.details["trainable_partition_elements"]
