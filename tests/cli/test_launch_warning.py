"""Where ``tune`` and ``measure`` print the launch environment a run was measured in, they say when the ranks'
threads outnumbered the cores (the ``deepspeed`` launcher's default rule on a small machine), as ``best`` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from tuner.cli.measure import render_measurement
from tuner.cli.study_view import render_study
from tuner.estimator import estimate
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

CROWDED = {
    "launcher": "deepspeed",
    "bind_cores": False,
    "threads_per_rank": [2, 2],
    "affinity_per_rank": [[0, 1], [0, 1]],
    "rule": "physical cores per rank",
}
ROOMY = {**CROWDED, "threads_per_rank": [1, 1]}


def tune_output(tmp_path: Path, launch: dict[str, Any]) -> str:
    tmp_path.mkdir(exist_ok=True)
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(64))
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("launch", store.upsert_workload(work), "tpe", {})
        config = shortcut_config(1, 1, "bf16", 2, "none", "none")
        trial_id = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(work, config))
        store.start_trial(trial_id)
        measurement = {"status": "ok", "tokens_per_s": 900.0, "peak_bytes_per_rank": [2**24] * 2, "launch": launch}
        store.finish_trial(trial_id, "ok", measurement)
        console = Console(record=True, width=200)
        render_study(store, study.id, "launch", console)
    return console.export_text()


def test_the_study_says_its_winner_ran_oversubscribed(tmp_path: Path) -> None:
    out = tune_output(tmp_path, CROWDED)
    assert "measured in: deepspeed launcher" in out
    assert "oversubscribed: 2 ranks × 2 threads on 2 cores" in out and "--launcher-env torchrun" in out
    assert "oversubscribed" not in tune_output(tmp_path / "roomy", ROOMY)


def test_measure_says_its_run_was_oversubscribed() -> None:
    result = {"status": "error", "error": "killed", "ranks": [], "launch": CROWDED}
    console = Console(record=True, width=200)
    render_measurement(result, console)
    out = console.export_text()
    assert "launch: deepspeed launcher" in out and "oversubscribed: 2 ranks × 2 threads on 2 cores" in out
