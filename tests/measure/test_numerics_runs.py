"""The numerics guard on real runs: two measured runs of the tiny GPT on 2 gloo CPU ranks with real DeepSpeed, one
with a broken loss average (the ``dstune.fault_loss_scale`` fault switch: the loss each rank backpropagates is
halved), recorded in a real SQLite store as the study records them: the healthy one ``ok`` (the reference), the
broken one ``diverged`` with both figures."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("needs DeepSpeed", allow_module_level=True)

from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.storage import Store
from tuner.study.numerics_guard import NumericsGuard
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
WORLD = 2


def trial(micro: int, accum: int, **dstune: float) -> TrialConfig:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * WORLD,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 50_000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    if dstune:
        config["dstune"] = dict(dstune)
    return TrialConfig(config)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two runs (fp32: the tightest tolerance), judged in the order measured and recorded in a store."""
    workload = Workload(
        load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=WORLD, device="cpu"), TrainSpec(seq_len=64)
    )
    options = MeasureOptions(warmup=1, steps=1, timeout=900, launcher="local")
    # the same global batch of 8, split differently: 2 × 2 healthy, 4 × 1 with the loss average broken
    runs = {"healthy": trial(2, 2), "broken": trial(4, 1, fault_loss_scale=0.5)}
    guard = NumericsGuard(WORLD)
    path = tmp_path_factory.mktemp("numerics") / "dstune.db"
    found: dict[str, Any] = {}
    with Store.open(f"sqlite:///{path}") as store:
        workload_id = store.upsert_workload(workload)
        study_id = store.get_or_create_study("numerics", workload_id, sampler="random", settings={}).id
        for number, (name, config) in enumerate(runs.items()):
            measured = run_measurement(workload, config, options)
            assert measured.status == "ok", measured.error
            reason = guard.judge(number, config, measured.numerics)
            trial_id = store.add_trial(study_id, number, config.key, config.ds_config, {}, False, None)
            store.start_trial(trial_id)
            store.finish_trial(trial_id, "diverged" if reason else "ok", measured.to_dict(), error=reason)
            found[name] = measured
        found["records"] = {t.number: t for t in store.trials(study_id)}
        found["best"] = store.best_trial(study_id)
    return found


def test_each_run_records_its_step0_loss_gradient_norm_and_losses(recorded: dict[str, Any]) -> None:
    for name in ("healthy", "broken"):
        numerics = recorded[name].numerics
        assert numerics["step0_loss"] > 0 and numerics["step0_grad_norm"] > 0
        assert len(numerics["losses"]) == 2 and numerics["losses"][0] == numerics["step0_loss"]  # warm-up + timed
        assert numerics["losses"][1] < numerics["losses"][0]  # Adam trained on the same batch: the loss fell
        figures = {key: numerics[key] for key in ("step0_loss", "step0_grad_norm", "losses")}
        # all-reduced: one figure per run
        assert all({key: rank.numerics[key] for key in figures} == figures for rank in recorded[name].ranks)
        assert numerics["step0_dropout_held"] == 0  # the built-in GPT has no dropout


def test_the_broken_loss_average_is_recorded_diverged_and_the_healthy_run_ok(recorded: dict[str, Any]) -> None:
    healthy, broken = recorded["records"][0], recorded["records"][1]
    assert healthy.status == "ok" and healthy.measurement["numerics"]["check"] == "reference"
    assert broken.status == "diverged" and broken.measurement["numerics"]["check"] == "diverged"
    numerics = broken.measurement["numerics"]
    # the same seeded global batch under another micro × accumulation split: the loss agrees to fp32 noise, the
    # gradient (what the broken average changes) is half
    assert numerics["loss_rel"] < 1e-5
    assert numerics["grad_norm_rel"] == pytest.approx(0.5, abs=1e-3)
    assert numerics["reference"]["step0_grad_norm"] == healthy.measurement["numerics"]["step0_grad_norm"]
    assert "grad norm" in broken.error and "trial 0" in broken.error
    assert recorded["best"].number == 0  # the broken run is never the best
