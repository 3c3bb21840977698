"""The numerics guard on the README's LoRA example, for real: tiny LLaMA with the adapter of the worked example
(``lora_dropout`` 0.05), bf16, 2 gloo CPU ranks, global batch 8, ZeRO-0 split micro 4 × 1 and 1 × 4, measured with
real DeepSpeed. Step 0 holds the dropout, so the two splits' step-0 figures agree to bf16's roundoff and the guard
judges 1 × 4 ``ok`` against 4 × 1 at the precision's own tolerance (with the masks drawn per micro-batch the norm
moved 2.04e-2 and 1 × 4 was called diverged)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs DeepSpeed and peft", allow_module_level=True)

from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.requests import WorkloadRequest, to_workload
from tuner.study.numerics_guard import TOLERANCES, NumericsGuard, relative
from tuner.workload import TrialConfig

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
WORLD = 2
README_ADAPTER = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
}


def trial(micro: int, accum: int) -> TrialConfig:
    return TrialConfig(
        {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accum,
            "train_batch_size": micro * accum * WORLD,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 0},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        }
    )


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    """The two splits, measured in that order and judged as a study judges them."""
    request = WorkloadRequest(
        model="tiny-llama", gpus=WORLD, device="cpu", seq_len=64, gpu_memory="1GiB", peft=README_ADAPTER
    )
    workload = to_workload(request)
    options = MeasureOptions(warmup=1, steps=1, timeout=900, launcher="local")
    guard = NumericsGuard(WORLD)
    found: dict[str, Any] = {}
    for number, (micro, accum) in enumerate(((4, 1), (1, 4))):
        config = trial(micro, accum)
        measured = run_measurement(workload, config, options)
        assert measured.status == "ok", measured.error
        found[f"{micro}x{accum}"] = measured.numerics
        found[f"reason {micro}x{accum}"] = guard.judge(number, config, measured.numerics)
    return found


def test_step0_holds_the_adapters_dropout(runs: dict[str, Any]) -> None:
    # one lora_dropout per adapted projection: q_proj and v_proj in each of the 4 layers
    assert runs["4x1"]["step0_dropout_held"] == runs["1x4"]["step0_dropout_held"] == 8


def test_two_splits_of_the_readme_lora_batch_agree_and_are_judged_ok(runs: dict[str, Any]) -> None:
    whole, split = runs["4x1"], runs["1x4"]
    # measured 1.4e-4 (bf16 roundoff); 2.04e-2 with the masks drawn per micro-batch
    assert relative(split["step0_grad_norm"], whole["step0_grad_norm"]) < TOLERANCES["bf16"] / 10
    assert relative(split["step0_loss"], whole["step0_loss"]) < 1e-6
    assert whole["check"] == "reference" and runs["reason 4x1"] is None
    assert split["check"] == "ok" and runs["reason 1x4"] is None and split["tolerance"] == TOLERANCES["bf16"]
