"""No path leaves an Optuna trial RUNNING on an error: an error while a trial is judged fails it in Optuna (with the
error as its reason) before it goes up, and a loop that fails with runs in flight fails their Optuna trials too, while
the store keeps them running so that a resume retries them. The real TuningStudy on a real SQLite store, measuring
through the scripted fake of ``test_loop_logic``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from tests.study.test_loop_logic import HANG, FakeMeasurer, optuna_trials, settings, shape, stop_when
from tuner.storage import Store
from tuner.study import TuningStudy
from tuner.study.outcome import REASON_ATTR


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as opened:
        yield opened


def test_an_error_while_a_trial_is_judged_fails_it_in_optuna(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any error between ``ask`` and the trial's outcome (here the estimator's judgement failing): the trial is told
    FAIL with the error, the error still ends the study (it is not a config's outcome), and nothing stays RUNNING."""
    import tuner.study.loop as loop

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the estimator failed")

    monkeypatch.setattr(loop, "judge", broken)
    with pytest.raises(RuntimeError, match="the estimator failed"):
        TuningStudy(settings(tmp_path, trials=2), store).run(FakeMeasurer())
    [trial] = optuna_trials(store)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs[REASON_ATTR] == "the study failed: RuntimeError: the estimator failed"
    assert store.get_study("logic").status == "failed"


def test_a_loop_failing_with_a_run_in_flight_fails_its_optuna_trial_and_a_resume_retries_it(
    tmp_path: Path, store: Store
) -> None:
    fake = FakeMeasurer(lambda config: HANG)
    with pytest.raises(ConnectionError):
        TuningStudy(settings(tmp_path, trials=2), store).run(
            fake, should_stop=stop_when(lambda: bool(fake.hanging), ConnectionError("database gone"))
        )
    assert [t.state for t in optuna_trials(store)] == [TrialState.FAIL]
    [stale] = store.trials(store.get_study("logic").id, status="running")  # for the resume to retry
    resumed = FakeMeasurer()
    TuningStudy(settings(tmp_path, trials=2), store).run(resumed)
    assert shape(resumed.submitted[0]) == shape(stale.ds_config)  # retried first
    assert store.get_trial(stale.id).status == "ok"
    assert not [t for t in optuna_trials(store) if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_every_trial_of_a_failing_study_is_finished_in_optuna(tmp_path: Path, store: Store) -> None:
    """Two slots, both runs in flight when the loop fails."""
    fake = FakeMeasurer(lambda config: HANG, slots=2)
    with pytest.raises(ConnectionError):
        TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store).run(
            fake, should_stop=stop_when(lambda: len(fake.hanging) == 2, ConnectionError("database gone"))
        )
    states = [t.state for t in optuna_trials(store)]  # besides the two runs, duplicates told pruned
    assert TrialState.RUNNING not in states and states.count(TrialState.FAIL) == 2


def test_a_run_whose_outcome_cannot_be_recorded_is_failed_in_optuna(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ended but recording it failed (the store's error): its Optuna trial is told FAIL, not left RUNNING."""
    from tuner.study.outcome import Recorder

    def broken(self: Recorder, run: Any, measurement: Any) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(Recorder, "finish", broken)
    with pytest.raises(OSError, match="disk I/O error"):
        TuningStudy(settings(tmp_path, trials=2), store).run(FakeMeasurer())
    [trial] = optuna_trials(store)
    assert trial.state == TrialState.FAIL and "disk I/O error" in trial.user_attrs[REASON_ATTR]
