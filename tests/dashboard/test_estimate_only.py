"""The dashboard marks estimates no run here can check (``estimate_only``: zero_quantized_nontrainable_weights on
CUDA, a 4-bit base): a note on the trial page, a marker beside the estimated peak in the study's table."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
pytest.importorskip("peft")

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.dashboard import router
from tuner.estimator import estimate
from tuner.requests import WorkloadRequest, to_workload
from tuner.storage import Store

LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def config(quantized: bool) -> dict:
    zero = {"stage": 3, "zero_quantized_nontrainable_weights": quantized}
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}


def test_trial_and_study_pages_mark_estimate_only(store: Store) -> None:
    workload = to_workload(WorkloadRequest(model="tiny-llama", gpus=2, seq_len=64, peft=LORA))
    study = store.get_or_create_study("lora-mixz", store.upsert_workload(workload), sampler="tpe", settings={})
    for number, quantized in enumerate((True, False)):
        ds_config = config(quantized)
        est = estimate(workload, ds_config).to_dict()
        assert est["estimate_only"] is quantized
        store.add_trial(study.id, number, f"config-{number}", ds_config, None, False, est, "pruned", "short", 1.0)
    app = FastAPI()
    app.state.store = store
    app.include_router(router)
    client = TestClient(app)
    marked, plain = client.get("/studies/lora-mixz/trials/0"), client.get("/studies/lora-mixz/trials/1")
    assert marked.status_code == plain.status_code == 200
    assert 'id="estimate-only"' in marked.text and "DeepSpeed&#39;s CUDA quantizer" in marked.text
    assert 'id="estimate-only"' not in plain.text
    table = client.get("/studies/lora-mixz").text
    assert table.count('class="estimate-only"') == 1
