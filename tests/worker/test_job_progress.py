"""A finished job's progress names its best trial by the number every other face gives it (``dstune tune``, ``best``,
the dashboard, ``/v1/recommend``'s ``trial_number``: from 0 in its study), its database id only as ``best_trial_id``;
the dashboard's job row links that trial."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.dashboard import router
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.worker.study_job import final_progress
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model


def test_a_finished_jobs_best_trial_is_named_by_its_number(tmp_path: Path) -> None:
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(64))
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        ids = {}
        for name in ("earlier", "nightly"):  # the earlier study's trials hold the first database ids
            study = store.get_or_create_study(name, store.upsert_workload(work), "random", {})
            for number, tokens in enumerate((500.0, 900.0, 700.0)):
                config = shortcut_config(1 + number, 1, "bf16", 2, "none", "none")
                trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, None)
                store.start_trial(trial_id)
                store.finish_trial(trial_id, "ok", {"status": "ok", "tokens_per_s": tokens})
                ids[name, number] = trial_id
        progress = final_progress(store, study.id, {"ok": 3}, 3)
        assert progress["best_trial_number"] == 1 and progress["best_trial_id"] == ids["nightly", 1] != 1
        assert progress["best_tokens_per_s"] == 900.0 and progress["trials"] == 3
        job = store.enqueue_job("nightly", {"workload": {"model": "tiny-gpt2"}})
        store.update_job_progress(job.id, progress)
        app = FastAPI()
        app.state.store = store
        app.include_router(router)
        page = TestClient(app).get("/").text
    row = page[page.index(f'data-job="{job.id}"') :].split("</tr>")[0]
    assert '<a class="best-trial" href="/studies/nightly/trials/1">trial 1</a>' in row and "900" in row
