"""The study's stopping rule (``tune --patience N``): once the best measured config stood for N measured trials
after it, the study asks for no more, says so, and a resumed study stays stopped (the rule is read from the store).
The real TuningStudy on a real SQLite store, its runs scripted by the loop tests' fake measurer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.study.test_loop_logic import FakeMeasurer, MiB, settings
from tuner.measure.measurement import Measurement
from tuner.storage import Store
from tuner.study import TuningStudy

SPEEDS = [100.0, 200.0, 300.0, 250.0, 240.0, 230.0, 220.0, 210.0]  # tokens/s of each run in turn: best the third


def in_turn(speeds: list[float]) -> Callable[[dict[str, Any]], Measurement]:
    """Each run measures the next of ``speeds``, whatever its config."""
    runs = iter(speeds)
    return lambda ds_config: Measurement(status="ok", tokens_per_s=next(runs), peak_bytes_per_rank=[MiB])


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as opened:
        yield opened


def study_of(tmp_path: Path, store: Store, patience: int | None) -> TuningStudy:
    base = settings(tmp_path, stages=[0, 1], micros=[1, 2, 4, 8], trials=len(SPEEDS))
    return TuningStudy(replace(base, global_batch=None, patience=patience), store)


def test_the_study_stops_once_its_best_stood_for_patience_measured_trials(tmp_path: Path, store: Store) -> None:
    """Runs 1-3 each beat the one before; runs 4 and 5 do not: with patience 2 the study stops after run 5, and a
    resumed study asks for nothing more."""
    study, measurer = study_of(tmp_path, store, 2), FakeMeasurer(in_turn(SPEEDS))
    report = study.run(measurer)
    assert report.settled and len(measurer.submitted) == 5
    best = store.best_trial(study.study_id)
    assert best is not None and best.tokens_per_s == 300.0
    assert store.get_study("logic").settings["patience"] == 2  # type: ignore[union-attr]
    again = FakeMeasurer(in_turn(SPEEDS))
    assert study_of(tmp_path, store, 2).run(again).settled and again.submitted == []


def test_without_patience_every_trial_of_the_budget_runs(tmp_path: Path, store: Store) -> None:
    """Off (the built-in trainer's studies, --patience 0): the budget alone ends the study, as before."""
    study, measurer = study_of(tmp_path, store, None), FakeMeasurer(in_turn(SPEEDS))
    report = study.run(measurer)
    assert not report.settled and len(measurer.submitted) == len(SPEEDS)
