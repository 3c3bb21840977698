"""The numerics guard inside the study, fast: the real TuningStudy on a real SQLite store, measuring through a
scripted fake whose runs carry step-0 figures (one config's gradient is half the others': a broken loss average)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner.measure.measurement import Measurement, StepHook
from tuner.storage import Store
from tuner.study import StudySettings, TuningStudy
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = """\
version: 1
base:
  optimizer:
    params: {lr: 1.0e-4}
parameters:
  stage:
    kind: categorical
    choices: [0, 1, 2]
    key: zero_optimization.stage
    default: 0
  micro_batch:
    kind: categorical
    choices: [1, 2]
    key: train_micro_batch_size_per_gpu
    default: 1
"""
BROKEN = (1, 2)  # (stage, micro): the config whose gradient is halved


def shape(config: dict[str, Any]) -> tuple[int, int]:
    return config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]


class NumericsMeasurer:
    """Every run ok, with step-0 figures: fp32 noise of 1e-6 between configs, half the gradient for :data:`BROKEN`."""

    slots = 1

    def __init__(self) -> None:
        self.order: list[tuple[int, int]] = []

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        key = shape(trial.ds_config)
        self.order.append(key)
        norm = 1.335 * (0.5 if key == BROKEN else 1 + 1e-6 * len(self.order))
        numerics = {"step0_loss": 6.948, "step0_grad_norm": norm, "losses": [6.948, 6.62]}
        measured = Measurement(status="ok", tokens_per_s=1000.0 + len(self.order), peak_bytes_per_rank=[2**20])
        measured.numerics = numerics
        if key == BROKEN:
            measured.tokens_per_s = 10_000.0  # the fastest: it must still never be the best
        future: Future[Measurement] = Future()
        future.set_result(measured)
        return future

    def cancel(self) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as opened:
        yield opened


def test_a_diverged_run_is_recorded_with_both_figures_told_fail_and_never_best(tmp_path: Path, store: Store) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(64))
    settings = StudySettings(
        name="numerics", workload=workload, space_path=space, global_batch=8, sampler="random", trials=6, seed=1
    )
    study = TuningStudy(settings, store)
    measurer = NumericsMeasurer()
    study.run(measurer)

    by_shape = {shape(t.ds_config): t for t in store.trials(study.study_id) if t.measurement}
    assert BROKEN in by_shape and len(by_shape) >= 3, measurer.order
    first = measurer.order[0]
    assert first != BROKEN, "seed 1 measures a healthy config first: the broken one is judged against it"
    frozen = optuna.load_study(study_name="numerics", storage=store.url).trials
    for key, trial in by_shape.items():
        assert trial.measurement is not None
        numerics = trial.measurement["numerics"]
        check = numerics["check"]
        if key == first:
            assert check == "reference" and trial.status == "ok"
        elif (key == BROKEN) != (first == BROKEN):  # the broken one against a healthy reference, or the reverse
            assert trial.status == "diverged" and check == "diverged"
            assert frozen[trial.number].state == TrialState.FAIL
            ref = numerics["reference"]
            assert ref["trial"] == by_shape[first].number and ref["step0_grad_norm"] is not None
            assert trial.error is not None and "grad norm" in trial.error and "vs" in trial.error
            expected = 0.5 if key == BROKEN else 1.0  # half the reference's, or twice a broken reference's
            assert numerics["grad_norm_rel"] == pytest.approx(expected, rel=1e-3)
        else:
            assert trial.status == "ok" and check == "ok"
            assert frozen[trial.number].state == TrialState.COMPLETE
    best = store.best_trial(study.study_id)
    assert best is not None and best.status == "ok" and shape(best.ds_config) != BROKEN
