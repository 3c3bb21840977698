"""The confirmation's rule (tuner.study.confirm_rule), pure: its timed steps chosen from the trial's own step times,
and its verdict from the medians of two runs' step times; then the same rule through confirm_best on a real SQLite
store (the run scripted by a fake measurer, as in test_confirm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.study.test_confirm import OneRun
from tuner.measure.measurement import Measurement, RankResult
from tuner.measure.options import MeasureOptions
from tuner.storage import Store
from tuner.study.confirm import confirm_best, confirmation_options
from tuner.study.confirm_rule import (
    CONFIRM_MAX_STEPS,
    CONFIRM_MAX_TIMED_S,
    CONFIRM_MIN_STEPS,
    CONFIRM_TIMED_S,
    confirmation_steps,
    holds,
    recorded_step_times,
    run_step_times,
    speed_ratio,
)
from tuner.workload import Workload, model_from_param_count


def test_a_confirmation_times_seconds_of_work_from_the_trials_own_step_time() -> None:
    # the outside check's case: 3 timed steps of about 0.07 s
    steps = confirmation_steps([0.07, 0.068, 0.075], 3)
    assert steps > 3 and steps * 0.07 >= CONFIRM_TIMED_S
    # slow steps: at least the floor, and never fewer than twice the trial's
    assert confirmation_steps([3.0, 3.0, 3.0], 3) == CONFIRM_MIN_STEPS
    assert confirmation_steps([3.0] * 8, 8) == 16
    # very fast steps: bounded
    assert confirmation_steps([1e-4, 1e-4, 1e-4], 3) == CONFIRM_MAX_STEPS
    # slow steps: no more timed work than the cap ...
    assert confirmation_steps([7.0, 7.0, 7.0], 3) == CONFIRM_MAX_TIMED_S // 7.0 == 8
    # ... yet always more steps than the trial's
    assert confirmation_steps([40.0, 41.0, 40.0], 3) == 4
    # a trial that kept no step times: the floor
    assert confirmation_steps([], 3) == CONFIRM_MIN_STEPS


def test_the_verdict_compares_medians_one_slow_step_moves_nothing() -> None:
    trial = [0.10, 0.10, 0.11]
    one_slow = [0.10] * 20 + [5.0]  # a mean would say 0.3× the trial's speed
    assert speed_ratio(trial, one_slow) == pytest.approx(1.0) and holds(speed_ratio(trial, one_slow))
    assert speed_ratio([0.10, 0.10, 0.01], [0.10] * 10) == pytest.approx(1.0)  # a lucky trial step neither
    assert speed_ratio(trial, [0.2] * 10) == pytest.approx(0.5) and not holds(0.5)
    assert holds(0.9) and not holds(0.89) and holds(1.7)  # a faster run does not contradict the trial's figure
    assert speed_ratio([], [0.1]) is None and speed_ratio(trial, []) is None and not holds(None)


def test_a_runs_step_times_are_its_slowest_ranks() -> None:
    assert run_step_times([[0.1, 0.3, 0.2], [0.2, 0.1]]) == [0.2, 0.3]
    stored = {"ranks": [{"step_times": [0.1, 0.2]}, {"step_times": [0.3, 0.1]}]}
    assert recorded_step_times(stored) == [0.3, 0.2] and recorded_step_times(None) == []


def _winner(tmp_path: Path) -> tuple[Store, int, Workload]:
    store = Store.open(f"sqlite:///{tmp_path / 'rule.db'}")
    workload = Workload(model_from_param_count(1e6))
    study = store.get_or_create_study("r", store.upsert_workload(workload), sampler="tpe", settings={})
    trial_id = store.add_trial(study.id, 0, "k0", {"train_micro_batch_size_per_gpu": 2}, {}, False, None)
    store.start_trial(trial_id)
    ranks = [RankResult(rank, "ok", step_times=[0.07, 0.07, 0.08]).to_dict() for rank in (0, 1)]
    measured = {"tokens_per_s": 1000.0, "step_time_s": {"p50": 0.07}, "ranks": ranks}
    store.finish_trial(trial_id, "ok", measured)
    return store, study.id, workload


def test_the_winner_is_confirmed_on_more_steps_by_the_median(tmp_path: Path) -> None:
    store, study_id, workload = _winner(tmp_path)
    best = store.best_trial(study_id)
    assert best is not None
    options = confirmation_options(best, MeasureOptions(steps=3))
    assert options.steps == confirmation_steps([0.07, 0.07, 0.08], 3) and options.steps_at_least == 3
    # a run of the same speed but one very slow step (its throughput figure dragged down by it)
    times = [0.07] * (options.steps - 1) + [3.0]
    ranks = [RankResult(rank, "ok", step_times=times) for rank in (0, 1)]
    measured = Measurement(status="ok", tokens_per_s=300.0, step_time_s={"p50": 0.07}, ranks=ranks)
    confirmation = confirm_best(store, study_id, workload, OneRun(measured))
    assert confirmation is not None and confirmation.ratio == pytest.approx(1.0) and confirmation.holds
    assert (confirmation.steps, confirmation.trial_steps) == (options.steps, 3)
    assert f"over {options.steps} timed steps; the trial's 0.07 s over 3" in confirmation.line()
    stored = store.get_trial(best.id).measurement["confirmation"]
    assert stored["holds"] is True and stored["steps"] == options.steps
