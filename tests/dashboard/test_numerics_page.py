"""The dashboard shows a diverged trial: its badge, and its step-0 figures beside the reference run's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.dashboard import router
from tuner.storage import Store
from tuner.study.numerics_guard import NumericsGuard
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model


def test_a_diverged_trial_shows_its_badge_and_both_figures(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dstune.db'}"
    workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(64))
    guard = NumericsGuard(2)
    healthy = TrialConfig({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2})
    broken = TrialConfig({**healthy.ds_config, "dstune": {"fault_loss_scale": 0.5}})
    with Store.open(url) as store:
        study = store.get_or_create_study("guarded", store.upsert_workload(workload), sampler="tpe", settings={})
        for number, (trial, norm) in enumerate(((healthy, 1.3352319), (broken, 0.6676161))):
            numerics = {"step0_loss": 6.9481223, "step0_grad_norm": norm, "losses": [6.9481223, 6.62]}
            reason = guard.judge(number, trial, numerics)
            trial_id = store.add_trial(study.id, number, trial.key, trial.ds_config, None, False, None)
            store.start_trial(trial_id)
            measurement = {"tokens_per_s": 1000.0, "peak_bytes_per_rank": [2**20], "numerics": numerics}
            store.finish_trial(trial_id, "diverged" if reason else "ok", measurement, error=reason)
    app = FastAPI()
    app.state.store = Store.open(url)
    app.include_router(router)
    try:
        client = TestClient(app)
        study_page = client.get("/studies/guarded").text
        assert '<span class="badge s-diverged">diverged</span>' in study_page
        page = client.get("/studies/guarded/trials/1").text
        assert '<span class="badge s-diverged">diverged</span>' in page
        table = page[page.index('id="numerics"') :]
        assert "0.667616" in table and "1.33523" in table and "5.00e-01" in table
        assert "Against trial\n      0, tolerance 0.0001 relative" in page
        assert "numerics diverged from trial 0" in page
        reference = client.get("/studies/guarded/trials/0").text
        assert "The study's reference run" in reference
    finally:
        app.state.store.close()
