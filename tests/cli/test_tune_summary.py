"""``dstune tune``'s summary of pruned trials: grouped by kind with counts, each kind with one reason in sizes."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tuner.cli.tune import render_study
from tuner.dsconfig import shortcut_config
from tuner.estimator import estimate
from tuner.storage import Store
from tuner.study import capacity_reason
from tuner.study.calibration import Calibration
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_model

OLD_REASON = (  # as the loop wrote it before reasons were for people
    "gpu: estimated peak 2016309042 B × (1 + margin 0.050) exceeds 67108864 B by 2050015630 B at the backward phase; "
    "largest category buffers"
)


def test_pruned_trials_are_summarised_by_kind(tmp_path: Path) -> None:
    work = Workload(
        load_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, gpu_memory=2**26, device="cpu"), TrainSpec(64)
    )
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("summary", store.upsert_workload(work), "tpe", {})
        reasons = []
        for number, micro in enumerate((32, 64, 128)):
            config = shortcut_config(micro, 1, "bf16", 0, "none", "none")
            est = estimate(work, config)
            reasons.append(capacity_reason(est, Calibration()))
            store.add_trial(study.id, number, f"k{number}", config, {}, False, est, "pruned", reasons[-1], 1.0)
        config = shortcut_config(1, 1, "bf16", 2, "none", "none")
        store.add_trial(study.id, 3, "old", config, {}, False, estimate(work, config), "pruned", OLD_REASON, 1.0)
        store.add_infeasible(study.id, 4, {"micro_batch": 3}, "micro-batch 3 × world size 1 = 3 does not divide 8")
        console = Console(record=True, width=400)
        render_study(store, study.id, "summary", console)
    out = console.export_text()

    assert "pruned without a run: 5, by kind" in out
    assert f"×3  GPU memory · forward · activations — e.g. {reasons[0]}\n" in out
    assert reasons[0].startswith("needs ") and " MiB of 64.0 MiB GPU memory at the forward phase" in reasons[0]
    assert "×1  GPU memory · backward · buffers — e.g. gpu: estimated peak 1.88 GiB × (1 + margin 0.050)" in out
    assert "2016309042" not in out  # older reasons' bytes print as sizes too
    assert "×1  micro-batch N × world size N = N does not divide N — e.g. micro-batch 3 × world size 1" in out
