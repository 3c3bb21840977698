"""The numerics guard on runs whose config changes the numerics: bf16 master weights and optimizer states, Muon
(pure logic; the figures are a real run's shape)."""

from __future__ import annotations

from tuner.study.numerics_guard import NumericsGuard
from tuner.workload import TrialConfig

BF16_MASTER = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


def trial(bf16: dict | None = None, optimizer: str | None = None) -> TrialConfig:
    config: dict = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": True, **(bf16 or {})},
    }
    if optimizer:
        config["optimizer"] = {"type": optimizer}
    return TrialConfig(config)


def figures(loss: float = 6.948, norm: float = 1.335) -> dict:
    return {"step0_loss": loss, "step0_grad_norm": norm}


def test_a_bf16_master_run_never_becomes_the_reference() -> None:
    guard = NumericsGuard(2)
    first = figures()
    assert guard.judge(0, trial(BF16_MASTER), first) is None and first["check"] == "unchecked"
    assert not guard.references


def test_bf16_master_differences_are_reported_against_the_fp32_master_reference() -> None:
    guard = NumericsGuard(2)
    guard.judge(0, trial(), figures())
    within = figures(norm=1.34)  # bf16 rounding of the same gradients
    assert guard.judge(1, trial(BF16_MASTER), within) is None
    assert within["check"] == "ok" and within["changes"] == [
        "bf16 master weights and gradients",
        "bf16 optimizer states",
    ]
    assert within["reference"]["trial"] == 0 and within["grad_norm_rel"] > 0
    broken = figures(loss=6.948 * 2)
    reason = guard.judge(2, trial(BF16_MASTER), broken)
    assert broken["check"] == "diverged" and reason is not None and "loss" in reason


def test_muon_is_judged_on_the_loss_its_norm_is_the_updates() -> None:
    guard = NumericsGuard(2)
    guard.judge(0, trial(), figures())
    muon = figures(norm=40.0)  # DeepSpeed's norm of Muon's orthogonalised update
    assert guard.judge(1, trial(optimizer="Muon"), muon) is None
    assert muon["check"] == "ok" and muon["changes"] == ["Muon optimizer"] and muon["grad_norm_rel"] > 1
