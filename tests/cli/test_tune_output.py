"""What ``dstune tune`` prints besides its live display: the line before DeepSpeed builds its ops, the top configs
(runs stopped early marked as such), and the summary of pruned trials (grouped by kind with counts, each kind with one
reason in sizes)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tuner.cli.study_view import render_study
from tuner.estimator import estimate
from tuner.forecast import Calibration
from tuner.measure.measurement import Measurement
from tuner.measure.op_builds import AnnounceBuilds
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.study import capacity_reason
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

OLD_REASON = (  # as the loop wrote it before reasons were for people
    "gpu: estimated peak 2016309042 B × (1 + margin 0.050) exceeds 67108864 B by 2050015630 B at the backward phase; "
    "largest category buffers"
)


class Inner:
    """A measurer that records what it was given and measures nothing."""

    slots = 1

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []
        self.cancelled = False

    def submit(self, workload: Workload, trial: TrialConfig, on_step: Any = None) -> Future[Measurement]:
        self.submitted.append(trial.ds_config)
        future: Future[Measurement] = Future()
        future.set_result(Measurement(status="ok"))
        return future

    def cancel(self) -> None:
        self.cancelled = True


def test_a_line_before_the_runs_that_build_deepspeed_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(64))
    plain = shortcut_config(1, 1, "bf16", 2, "none", "none")
    offload = shortcut_config(1, 1, "bf16", 2, "cpu", "none")
    lines: list[str] = []
    inner = Inner()
    builds: list[tuple[list[str], int]] = []  # the ops built, and how many runs had started by then

    def build(ops: list[str]) -> bool:
        builds.append((list(ops), len(inner.submitted)))
        return True

    measurer = AnnounceBuilds(inner, lines.append, build)
    measurer.prebuilt = set()  # whatever this machine's DeepSpeed was installed with
    for config in (plain, plain, offload, offload):
        measurer.submit(work, TrialConfig(config))
    assert inner.submitted == [plain, plain, offload, offload]
    # each op built once, before the run that needs it starts (outside its timeout)
    assert builds == [(["deepspeed_shm_comm", "fused_adam"], 0), (["cpu_adam"], 2)]
    assert lines == [
        f"Building DeepSpeed's CPU ops (deepspeed_shm_comm, fused_adam) once; later runs reuse them from {tmp_path}",
        f"Building DeepSpeed's CPU ops (cpu_adam) once; later runs reuse them from {tmp_path}",
    ]
    measurer.cancel()
    assert inner.cancelled and measurer.slots == 1


def test_pruned_trials_are_summarised_by_kind(tmp_path: Path) -> None:
    work = Workload(
        load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, gpu_memory=2**26, device="cpu"), TrainSpec(64)
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
    # a reason of the space keeps its values, and its kind is the reason itself: printed once
    assert "×1  micro-batch 3 × world size 1 = 3 does not divide 8\n" in out


def test_runs_stopped_early_are_marked_in_the_top_configs(tmp_path: Path) -> None:
    """A run the throughput pruner stopped is ``ok`` with partial figures (no peak): its row says so, the others not."""
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(64))
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("stopped", store.upsert_workload(work), "tpe", {})
        for number, (micro, tokens, stopped) in enumerate(((1, 900.0, False), (2, 300.0, True))):
            config = shortcut_config(micro, 1, "bf16", 2, "none", "none")
            trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, False, estimate(work, config))
            store.start_trial(trial_id)
            measurement: dict[str, Any] = {"status": "ok", "tokens_per_s": tokens, "stopped_early": stopped}
            measurement["peak_bytes_per_rank"] = [None] if stopped else [2**24]
            store.finish_trial(trial_id, "ok", measurement)
        console = Console(record=True, width=400)
        render_study(store, study.id, "stopped", console)
    out = console.export_text()
    rows = {line.split()[0]: line for line in out.split("best:")[0].splitlines() if line[:8].strip().isdigit()}
    assert "stopped" in rows["1"] and "300" in rows["1"]
    assert "stopped" not in rows["0"] and "900" in rows["0"] and "0.016" in rows["0"]
    assert rows["1"].split()[2] == "-"  # no peak measured: no made-up 0 GiB
    assert "stopped: the run was clearly slower than the best and was stopped early" in out


@pytest.mark.parametrize("width", [80, 100])
def test_the_top_configs_keep_every_figure_whole_in_a_narrow_terminal(tmp_path: Path, width: int) -> None:
    """At 80 columns (a CI log, a small terminal) no figure is cut or folded: headers wrap, figures stay whole."""
    work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(64))
    figures = []
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("narrow", store.upsert_workload(work), "tpe", {})
        for number, (micro, tokens, stopped) in enumerate(((64, 16_912.4, False), (32, 123_456.7, True))):
            config = shortcut_config(micro, 8, "bf16", 3, "cpu", "cpu")
            trial_id = store.add_trial(study.id, number, f"k{number}", config, {}, True, estimate(work, config))
            store.start_trial(trial_id)
            store.finish_trial(
                trial_id, "ok", {"status": "ok", "tokens_per_s": tokens, "stopped_early": stopped,
                                 "peak_bytes_per_rank": [1_234_567_890]}
            )  # fmt: skip
            figures.append(f"{tokens:,.0f}")
        console = Console(record=True, width=width)
        render_study(store, study.id, "narrow", console)
    out = console.export_text()
    table = out.split("stopped: the run")[0]
    assert "…" not in table
    for figure in [*figures, "1.150", "78.85", "cpu/cpu", "stopped", "tokens/s"]:
        assert figure in table, (figure, table)
    assert max(len(line) for line in table.splitlines()) <= width


@pytest.mark.parametrize(("seq_len", "global_batch", "warned"), [(2048, None, True), (64, 4, False)])
def test_a_cpu_study_whose_runs_will_be_slow_says_so_up_front(
    tmp_path: Path, seq_len: int, global_batch: int | None, warned: bool
) -> None:
    """A newcomer's ``--gpus 1`` tiny-llama study at sequence 2048 measures 64 × 8 × 2048 tokens a step first: the
    throughput model's seconds for that run are printed before it starts, with what makes runs shorter."""
    from tuner.cli.study_view import warn_slow_runs
    from tuner.space import default_space_path
    from tuner.study import StudySettings, TuningStudy

    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(seq_len))
    settings = StudySettings("slow", work, default_space_path(), global_batch=global_batch)
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        console = Console(record=True, width=100)
        warn_slow_runs(TuningStudy(settings, store), 2, 3, console)
    out = " ".join(console.export_text().split())
    if warned:
        assert out.startswith("slow runs ahead: the first measured run takes about ")
        assert "2 warm-up + 3 timed steps of ~" in out and "1,048,576 tokens a step" in out
        assert "--global-batch" in out
    else:
        assert out == ""


def test_configs_differing_only_by_layout_show_it_and_a_mib_budget_reads_in_mib(tmp_path: Path) -> None:
    """Two runs that differ only by Ulysses or ALST's tiling printed as identical rows, and under a 64 MiB budget
    every free figure read 0.00 GiB: a layout column appears when a row has a layout, and a budget below 1 GiB is
    shown in MiB."""
    work = Workload(
        load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=2, gpu_memory=2**26, device="cpu"), TrainSpec(64)
    )
    plain = shortcut_config(1, 1, "bf16", 2, "none", "none")
    layouts = ({}, {"sequence_parallel_size": 2}, {"dstune": {"tiled_mlp_shards": 4}})
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        study = store.get_or_create_study("layouts", store.upsert_workload(work), "tpe", {})
        for number, extra in enumerate(layouts):
            trial_id = store.add_trial(
                study.id, number, f"k{number}", {**plain, **extra}, {}, False, estimate(work, plain)
            )
            store.start_trial(trial_id)
            peak = [40 * 2**20 + number * 2**20]
            store.finish_trial(
                trial_id, "ok", {"status": "ok", "tokens_per_s": 1000.0 - number, "peak_bytes_per_rank": peak}
            )
        console = Console(record=True, width=100)
        render_study(store, study.id, "layouts", console)
    table = console.export_text().split("trials by status")[0]
    assert "peak MiB" in table and "free MiB" in table and "layout" in table
    rows = {line.split()[0]: line for line in table.splitlines() if line[:8].strip().isdigit()}
    assert "40.0" in rows["0"] and "24.0" in rows["0"]  # 64 - 40 MiB free
    assert "SP 2" in rows["1"] and "tiled MLP 4" in rows["2"] and "SP" not in rows["0"]
