"""The grid sampler (``tune --sampler grid``) with ``--allow-numerics-changes``: its grid covers the numerics choices
the option adds (the real TuningStudy on SQLite, the estimator gate deciding what runs, measuring through a fake
that answers every run ok); without the option the grid is stage × micro-batch, as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.space.test_numerics_choices import AllOk, memory_bound
from tuner.space import default_space_path
from tuner.space.dsconfig import export_config
from tuner.storage import Store
from tuner.study import StudySettings, TuningStudy, grid_parameters
from tuner.study.loop import _study_space

PINS = {"offload_optimizer": "none", "reduce_bucket_size": 10_000_000, "allgather_bucket_size": 10_000_000}


def settings(name: str, allowed: bool) -> StudySettings:
    return StudySettings(
        name=name,
        workload=memory_bound(),
        space_path=default_space_path(),
        pins={**PINS, "stage": 1},
        global_batch=1,
        trials=16,  # the whole grid: stage 1 x micro-batch 1 x the numerics choices
        seed=3,
        sampler="grid",
        allow_numerics_changes=allowed,
    )


def test_without_the_option_the_grid_is_stage_by_micro_batch() -> None:
    space = _study_space(replace(settings("plain", False), pins=PINS))
    assert space.searched == ("stage", "micro_batch")
    assert grid_parameters(space) == ("stage", "micro_batch")


def test_with_the_option_the_grid_holds_the_numerics_choices() -> None:
    space = _study_space(replace(settings("allowed", True), pins=PINS))
    names = ("stage", "micro_batch", "bf16_master_weights", "bf16_optimizer_states", "muon", "chunked_loss")
    assert grid_parameters(space) == names and space.searched == names


def test_a_memory_bound_grid_study_fits_only_with_bf16_master_weights_and_says_so(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        plain, nothing = TuningStudy(settings("plain", False), store), AllOk()
        plain.run(nothing)
        assert not nothing.measured and all(t.status == "pruned" for t in store.trials(plain.study_id))

        study, measurer = TuningStudy(settings("allowed", True), store), AllOk()
        study.run(measurer)
        assert measurer.measured and all(trial.numerics.bf16_master for trial in measurer.measured)
        best = store.best_trial(study.study_id)
        assert best is not None and best.trial.numerics.bf16_master
        _, notes = export_config(best.trial, "deepspeed")
        assert any("changes the numerics" in note and "bf16 master weights" in note for note in notes), notes
