"""``dstune tune``'s top-configs table tells its rows apart: configs that differ only in a setting no column shows (a
bucket size, ``overlap_comm``, a dstune run setting) say where they differ below the table, the layout column names
every layout of the registry, and memory reads in the budget's unit even for runs without an estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tuner.cli.study_view import layout_text, render_study
from tuner.estimator import estimate
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model
from tuner.workload.layouts import LAYOUTS

WORK = Workload(
    load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, gpu_memory=2**26, device="cpu"), TrainSpec(64)
)


def rendered(tmp_path: Path, configs: list[dict[str, Any]], with_estimate: bool = True) -> str:
    """The study output of ok trials 0, 1... with these configs (trial 0 fastest), measured at 40, 41... MiB."""
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("apart", store.upsert_workload(WORK), "tpe", {})
        for number, config in enumerate(configs):
            est = estimate(WORK, config) if with_estimate else None
            trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, est)
            store.start_trial(trial_id)
            peak = [(40 + number) * 2**20]
            measurement = {"status": "ok", "tokens_per_s": 1000.0 - number, "peak_bytes_per_rank": peak}
            store.finish_trial(trial_id, "ok", measurement)
        console = Console(record=True, width=80)
        render_study(store, study.id, "apart", console)
    return console.export_text()


def test_configs_differing_only_in_settings_no_column_shows_say_where(tmp_path: Path) -> None:
    """Two configs alike in every column (ZeRO-2, micro 1, accum 1, no offload) but for their buckets and
    overlap_comm printed as identical rows: the lines under the table name each one's values of those settings."""
    plain = shortcut_config(1, 1, "bf16", 2, "none", "none")
    zero = plain["zero_optimization"]
    first = {**plain, "zero_optimization": {**zero, "reduce_bucket_size": 500_000_000, "overlap_comm": True}}
    second = {**plain, "zero_optimization": {**zero, "reduce_bucket_size": 106_452_590, "overlap_comm": False}}
    second["dstune"] = {"threads_per_rank": 4}
    out = rendered(tmp_path, [first, second, plain])
    table, below = out.split("where these configs also differ")
    rows = [line.split()[4:] for line in table.splitlines() if line[:6].strip().isdigit()]
    assert len(rows) == 3 and rows[0] == rows[1] == rows[2]  # the columns alone cannot tell them apart
    lines = [line.strip() for line in below.split("trials by status")[0].splitlines()[1:] if line.strip()]
    assert lines == [
        "trial 0: reduce_bucket_size=5e8 · overlap_comm=true",
        "trial 1: reduce_bucket_size=1.06e8 · overlap_comm=false · threads_per_rank=4",
        "trial 2: (sets none of them)",
    ]


def test_configs_differing_in_the_columns_alone_add_nothing_below(tmp_path: Path) -> None:
    configs = [shortcut_config(micro, 1, "bf16", 2, "none", "none") for micro in (1, 2)]
    configs.append({**configs[0], "sequence_parallel_size": 2})
    out = rendered(tmp_path, configs)
    assert "also differ" not in out and "SP 2" in out  # the layout's keys are the layout column's


def test_runs_without_an_estimate_read_in_the_budget_unit(tmp_path: Path) -> None:
    """A training command's runs of its own model have no estimate: under a 64 MiB budget their peaks printed as
    0.039 GiB with no free figure; the unit follows the workload's budget, and free memory is measured against it."""
    out = rendered(tmp_path, [shortcut_config(1, 1, "bf16", 2, "none", "none")], with_estimate=False)
    table = out.split("trials by status")[0]
    assert "MiB" in table and "GiB" not in table
    (row,) = [line.split() for line in table.splitlines() if line[:6].strip().isdigit()]
    assert row[2:4] == ["40.0", "24.0"]  # 64 - 40 MiB free


@pytest.mark.parametrize("kind", LAYOUTS, ids=lambda kind: kind.label)
def test_the_layout_column_names_every_layout_of_the_registry(kind: Any) -> None:
    assert layout_text(TrialConfig(kind.config(2))) == f"{kind.label} 2"
