"""A training command's study without ``--model`` (its own ``nn.Module``): nothing estimated nor pruned before a
run, the memory boundary learned from the runs, and the answers given from what was measured only (the real
TuningStudy on a real SQLite store, its runs scripted by the loop tests' fake measurer)."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.study.test_loop_logic import FakeMeasurer, MiB, settings, shape
from tuner.cli.study_view import render_study
from tuner.dashboard._views import describe_workload
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.failures import ScriptFailed
from tuner.recommend import NoFeasibleConfig, recommend
from tuner.storage import Store
from tuner.study import TuningStudy
from tuner.study.loop import UNKNOWN_LENGTH
from tuner.study.settings import NO_MODEL_NOTE
from tuner.workload import ClusterSpec, TrainSpec, Workload, unknown_model

# a rank memory the built-in estimator would prune every config of a real model with
TINY = 64 * MiB


def own_model(command: str = "3f2a9c1d", gpu_memory: int = TINY) -> Workload:
    return Workload(
        unknown_model(command), ClusterSpec(gpus_per_node=1, gpu_memory=gpu_memory, device="cpu"), TrainSpec(64)
    )


def oom_from_micro_4(ds_config: dict[str, Any]) -> Measurement:
    stage, micro = shape(ds_config)
    if micro >= 4:
        return Measurement(status="oom", exception_type="OutOfMemoryError", error="out of memory")
    return Measurement(status="ok", tokens_per_s=1000.0 * micro + stage, samples_per_s=micro, peak_bytes_per_rank=[MiB])


def study_of(tmp_path: Path, store: Store, outcome: Any, **options: Any) -> tuple[TuningStudy, FakeMeasurer]:
    base = settings(tmp_path, stages=[0, 1], micros=[1, 2, 4, 8], trials=8, work=own_model())
    script = ScriptCommand(("python", "train.py"), str(tmp_path))
    dispatch = MeasureOptions(script=script, **options)
    study = TuningStudy(replace(base, global_batch=None, dispatch=dispatch), store)
    return study, FakeMeasurer(outcome)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as opened:
        yield opened


def test_nothing_is_pruned_before_a_run_and_the_runs_draw_the_memory_boundary(tmp_path: Path, store: Store) -> None:
    """Every config runs unless a config that ran out of memory needs no more than it; no trial carries an estimate
    and the study records that it could not prune."""
    study, measurer = study_of(tmp_path, store, oom_from_micro_4)
    study.run(measurer)
    trials = store.trials(study.study_id)
    assert all(t.estimate is None for t in trials)
    pruned = [t for t in trials if t.status == "pruned"]
    assert all("ran out of memory at trial" in (t.prune_reason or "") for t in pruned)
    ooms = [t for t in trials if t.status == "oom"]
    assert ooms and all(t.trial.batch[0] >= 4 for t in ooms)
    assert {shape(config)[1] for config in measurer.submitted} >= {1, 2}
    assert len(measurer.submitted) == len(trials) - len(pruned)
    record = store.get_study(study.settings.name)
    assert record is not None and record.settings["no_model"] == NO_MODEL_NOTE
    described = describe_workload(store.get_workload(record.workload_id))  # the dashboard's line: no size, no length
    assert "its own model, not described" in described and "params" not in described and "seq" not in described
    best = store.best_trial(study.study_id)
    assert best is not None and best.trial.batch[0] == 2


def test_the_answer_is_what_was_measured_or_none(tmp_path: Path, store: Store) -> None:
    """recommend: the measured winner of the command's own model; at a global batch nothing measured trains, or for
    another command's model, no answer (nothing to estimate, adapt or borrow from another command)."""
    study, measurer = study_of(tmp_path, store, oom_from_micro_4)
    study.run(measurer)
    best = store.best_trial(study.study_id)
    assert best is not None
    answer = recommend(store, own_model())
    assert answer.source == "measured" and answer.trial.key == best.trial.key
    with pytest.raises(NoFeasibleConfig, match="at global batch 1024"):
        recommend(store, own_model(), global_batch=1024)
    with pytest.raises(NoFeasibleConfig, match="no measured config of this training command's own model"):
        recommend(store, own_model("0badc0de"))


def test_a_study_without_the_sequence_length_stops_at_its_first_trial(tmp_path: Path, store: Store) -> None:
    """Samples/s measured but no tokens per sample (no token ids seen, no --seq-len): the study stops saying so."""

    def samples_only(ds_config: dict[str, Any]) -> Measurement:
        return Measurement(status="ok", samples_per_s=10.0, peak_bytes_per_rank=[MiB])

    study, measurer = study_of(tmp_path, store, samples_only, seq_len_known=False)
    with pytest.raises(ScriptFailed) as stopped:
        study.run(measurer)
    assert stopped.value.message == UNKNOWN_LENGTH and len(measurer.submitted) == 1


def test_a_guided_study_of_a_commands_model_measures_each_stages_largest_micro_batch_first(
    tmp_path: Path, store: Store
) -> None:
    """Nothing to predict with: the largest micro-batch of each stage first, from the stage that needs the least
    memory; micro-batch 8 running out of memory at ZeRO-1 rules it out at ZeRO-0 without a run."""
    study, measurer = study_of(tmp_path, store, oom_from_micro_4)
    study = TuningStudy(replace(study.settings, sampler="tpe", name="guided"), store)
    study.run(measurer)
    assert shape(measurer.submitted[0]) == (1, 8) and (0, 8) not in [shape(c) for c in measurer.submitted]
    heavier = next(t for t in store.trials(study.study_id) if t.trial.batch[0] == 8 and t.trial.stage == 0)
    assert heavier.status == "pruned" and "ran out of memory at trial 0" in (heavier.prune_reason or "")


def test_a_run_clearly_slower_in_samples_per_second_is_stopped_early(tmp_path: Path, store: Store) -> None:
    """Tokens per sample unknown before a run (no --seq-len): a run is judged against the best in samples/s."""

    def first_fast(ds_config: dict[str, Any], on_step: Any = None) -> Any:
        if len(measurer.submitted) == 1:  # the first run: 100 samples/s
            return Measurement(status="ok", tokens_per_s=6400.0, samples_per_s=100.0, peak_bytes_per_rank=[MiB])
        return [1.0, 1.0, 1.0]  # micro-batch ≤ 8 samples a second: far below half the best

    study, measurer = study_of(tmp_path, store, first_fast, seq_len_known=False)
    measurer.outcome = first_fast
    study.run(measurer)
    later = [t for t in store.trials(study.study_id) if t.status == "ok" and t.tokens_per_s != 6400.0]
    assert later and all((t.measurement or {}).get("stopped_early") for t in later)
    assert all(len(t.measurement["ranks"][0]["step_times"]) == 2 for t in later)  # type: ignore[index]


def test_the_top_configs_show_a_run_stopped_before_its_tokens_were_known(tmp_path: Path, store: Store) -> None:
    """A command's run stopped early never reports the token ids it saw: its tokens/s is unknown, shown as '-'."""
    stopped = Measurement(status="ok", samples_per_s=1.0, stopped_early=True, peak_bytes_per_rank=[None])
    fast = Measurement(status="ok", tokens_per_s=6400.0, samples_per_s=100.0, peak_bytes_per_rank=[MiB])
    study, measurer = study_of(tmp_path, store, lambda config: fast if len(measurer.submitted) == 1 else stopped)
    study.run(measurer)
    out = io.StringIO()
    render_study(store, study.study_id, study.settings.name, Console(file=out, width=200))
    rows = [line.split() for line in out.getvalue().splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert any(row[1] == "-" for row in rows) and any(row[1] == "6,400" for row in rows)
