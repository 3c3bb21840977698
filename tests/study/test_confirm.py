"""The winner confirmed by an independent run (tuner.study.confirm), fast: a real SQLite store, the run scripted by a
fake measurer standing in for the dispatcher (the real run is in tests/measure/test_script_runs.py)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tuner.measure.measurement import Measurement, StepHook
from tuner.storage import Store, StoreError
from tuner.study.confirm import Confirmation, confirm_best, recorded_confirmation
from tuner.workload import TrialConfig, Workload, model_from_param_count


class OneRun:
    """Answers every run with ``measured`` and keeps what it was given."""

    slots = 1

    def __init__(self, measured: Measurement | Exception) -> None:
        self.measured = measured
        self.submitted: list[tuple[dict[str, Any], bool]] = []

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        self.submitted.append((trial.ds_config, on_step is not None))
        future: Future[Measurement] = Future()
        if isinstance(self.measured, Exception):
            future.set_exception(self.measured)
        else:
            future.set_result(self.measured)
        return future

    def cancel(self) -> None:
        pass


def _study(tmp_path: Path) -> tuple[Store, int, int, Workload]:
    """A study of two measured trials (stage 1 at 900 tokens/s, stage 2 at 1,000: the winner) and a pruned one."""
    store = Store.open(f"sqlite:///{tmp_path / 'confirm.db'}")
    workload = Workload(model_from_param_count(1e6))
    study = store.get_or_create_study("s", store.upsert_workload(workload), sampler="tpe", settings={})
    ids = []
    for number, (stage, tokens) in enumerate([(1, 900.0), (2, 1000.0)]):
        config = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": 2}
        trial_id = store.add_trial(study.id, number, f"k{number}", config, {"stage": stage}, False, None)
        store.start_trial(trial_id)
        store.finish_trial(trial_id, "ok", {"tokens_per_s": tokens, "peak_bytes_per_rank": [7, 9]})
        ids.append(trial_id)
    store.add_trial(study.id, 2, "k2", {"zero_optimization": {"stage": 0}}, None, False, None, status="pruned")
    return store, study.id, ids[1], workload


def test_the_winner_is_run_once_more_and_the_run_recorded_beside_it(tmp_path: Path) -> None:
    store, study_id, winner, workload = _study(tmp_path)
    run = OneRun(Measurement(status="ok", tokens_per_s=950.0, step_time_s={"p50": 0.5}, peak_bytes_per_rank=[8, 11]))
    confirmation = confirm_best(store, study_id, workload, run)
    assert confirmation is not None and confirmation.ratio == pytest.approx(0.95) and confirmation.holds
    # the winner's own config, run to the end (no early stop)
    assert run.submitted == [({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2}, False)]
    record = store.get_trial(winner)
    assert record.tokens_per_s == 1000.0  # the trial's own figures stay
    stored = record.measurement["confirmation"]
    assert stored["tokens_per_s"] == 950.0 and stored["ratio"] == pytest.approx(0.95) and stored["peak_bytes"] == 11
    assert recorded_confirmation(record) == confirmation
    # confirmed once: asking again answers from the record, with no second run
    assert confirm_best(store, study_id, workload, run) == confirmation and len(run.submitted) == 1


@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        (
            Measurement(status="oom", error="Traceback ...\nRuntimeError: DefaultCPUAllocator: can't allocate memory"),
            "not confirmed: the independent run ended oom: RuntimeError: DefaultCPUAllocator: can't allocate memory",
        ),
        (RuntimeError("Ray is gone"), "not confirmed: the independent run ended error: Ray is gone"),
        (
            Measurement(status="ok", tokens_per_s=600.0),
            "not confirmed: an independent run measured 600 tokens/s, 0.60× the trial's 1,000 (below 0.90×)",
        ),
    ],
)
def test_a_confirmation_that_fails_or_falls_short_says_so(tmp_path: Path, measured: Any, expected: str) -> None:
    store, study_id, winner, workload = _study(tmp_path)
    confirmation = confirm_best(store, study_id, workload, OneRun(measured))
    assert confirmation is not None and not confirmation.holds
    assert confirmation.line() == expected
    assert recorded_confirmation(store.get_trial(winner)) == confirmation


def test_only_a_measured_trial_takes_a_confirmation(tmp_path: Path) -> None:
    store, study_id, _, _ = _study(tmp_path)
    pruned = store.find_trial_by_key(study_id, "k2")
    assert pruned is not None
    with pytest.raises(StoreError, match="pruned, not a measured trial"):
        store.record_confirmation(pruned.id, Confirmation(2, "ok", 1.0, 1.0).to_dict())


def test_a_study_without_a_measured_trial_has_nothing_to_confirm(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'empty.db'}")
    workload = Workload(model_from_param_count(1e6))
    study = store.get_or_create_study("e", store.upsert_workload(workload), sampler="tpe", settings={})
    run = OneRun(Measurement(status="ok", tokens_per_s=1.0))
    assert confirm_best(store, study.id, workload, run) is None and run.submitted == []
