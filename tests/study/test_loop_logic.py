"""The tuning loop's logic, fast: the real TuningStudy on a real SQLite store, measuring through a scripted fake.

The fake stands in for the Dispatcher only (``tuner.study.Measurer``): every config is estimated, pruned, recorded,
told to Optuna and resumed by the real code. Runs finish at once (or hang until cancelled), so these take seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner.estimator import estimate
from tuner.forecast import DEFAULT_MARGIN, reason_key
from tuner.measure.dispatch import Dispatcher
from tuner.measure.measurement import CANCELLED, INFRA_LOST, STOPPED_EARLY, Measurement, RankResult, StepHook
from tuner.measure.options import MeasureOptions
from tuner.space import default_space_path
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store, new_holder, release
from tuner.study import Event, Measurer, SlowRunStopper, StudySettings, TuningStudy
from tuner.study.outcome import DUPLICATE_ATTR, REASON_ATTR
from tuner.study.resume import HOLDER_ATTR, OWNER_ATTR
from tuner.study.stopper import REPEAT_LIMIT
from tuner.units import format_bytes
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

optuna.logging.set_verbosity(optuna.logging.WARNING)

HANG = object()  # a scripted run that ends only when the measurer is cancelled
MiB = 2**20
SPACE = """\
version: 1
base:
  optimizer:
    params: {{lr: 1.0e-4}}
parameters:
  stage:
    kind: categorical
    choices: {stages}
    key: zero_optimization.stage
    default: 0
  micro_batch:
    kind: categorical
    choices: {micros}
    key: train_micro_batch_size_per_gpu
    default: 1
"""
Outcome = Callable[[dict[str, Any]], Any]


def ok(config: dict[str, Any]) -> Measurement:
    """A successful run whose throughput identifies its config (stage and micro-batch)."""
    stage, micro = config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]
    return Measurement(status="ok", tokens_per_s=1000.0 * (stage + 1) + micro, peak_bytes_per_rank=[10 * MiB])


class FakeMeasurer:
    """Scripted measurements: ``outcome(ds_config)`` is each run's Measurement, an exception, :data:`HANG`, or a
    list of step times (:func:`stepped`: each is shown to the run's ``on_step`` as a real run's would be)."""

    def __init__(self, outcome: Outcome = ok, slots: int = 1, delay_s: float = 0.0) -> None:
        self.slots, self.outcome, self.delay_s = slots, outcome, delay_s
        self.submitted: list[dict[str, Any]] = []
        self.hanging: list[Future[Measurement]] = []
        self.cancelled = False
        self.hooked: list[bool] = []  # whether each run was given an on_step

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        assert not self.cancelled, "a run was submitted after cancel()"
        ds_config = trial.ds_config
        self.submitted.append(ds_config)
        self.hooked.append(on_step is not None)
        future: Future[Measurement] = Future()
        result = self.outcome(ds_config)
        if isinstance(result, list):
            result = stepped(result, on_step)
        if result is HANG:
            self.hanging.append(future)
        elif self.delay_s:
            threading.Timer(self.delay_s, _resolve, (future, result)).start()
        else:
            _resolve(future, result)
        return future

    def cancel(self) -> None:
        self.cancelled = True
        for future in self.hanging:
            if not future.done():
                future.set_result(Measurement(status="error", exception_type=CANCELLED, error="killed"))


def stepped(step_times: list[float], on_step: StepHook | None, tokens_per_step: float = 64 * 64) -> Measurement:
    """The measurement of a run whose timed steps take ``step_times``, stopped early when ``on_step`` says so after
    a step (as the launcher does): ok, its partial step times and ``stopped_early``."""
    done: list[float] = []
    stopped = False
    for seconds in step_times:
        done.append(seconds)
        if on_step is not None and on_step(list(done)):
            stopped = True
            break
    p50 = sorted(done)[len(done) // 2]
    return Measurement(
        status="ok",
        tokens_per_s=tokens_per_step / p50,
        step_time_s={"p50": p50, "p90": max(done)},
        peak_bytes_per_rank=[None if stopped else 10 * MiB],
        ranks=[RankResult(0, "ok", exception_type=STOPPED_EARLY if stopped else None, step_times=done)],
        stopped_early=stopped,
    )


def _resolve(future: Future[Measurement], result: Any) -> None:
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def workload(gpu_memory: int = 64 * 2**30) -> Workload:
    return Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=1, gpu_memory=gpu_memory, device="cpu"),
        TrainSpec(64),
    )


def settings(
    tmp_path: Path,
    *,
    stages: list[int] = (0,),
    micros: list[int] = (1, 2),
    trials: int = 4,
    work: Workload | None = None,
    **extra: Any,
) -> StudySettings:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.format(stages=list(stages), micros=list(micros)))
    return StudySettings(
        name="logic",
        workload=work or workload(),
        space_path=space,
        global_batch=64,
        sampler="random",
        trials=trials,
        seed=7,
        **extra,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as opened:
        yield opened


def optuna_trials(store: Store) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="logic", storage=store.url).trials


def shape(config: dict[str, Any]) -> tuple[int, int]:
    return config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]


def stop_when(condition: Callable[[], bool], error: BaseException | None = None) -> Callable[[], bool]:
    """A ``should_stop`` that says stop (or raises ``error``) once ``condition()`` holds."""

    def should_stop() -> bool:
        if condition() and error is not None:
            raise error
        return condition()

    return should_stop


def test_the_dispatcher_and_the_fake_are_measurers() -> None:
    dispatcher = Dispatcher(MeasureOptions(launcher="local"), "cpu", 1)
    try:
        assert isinstance(dispatcher, Measurer) and dispatcher.slots == 1
    finally:
        dispatcher.close()
    assert isinstance(FakeMeasurer(), Measurer)


def test_configs_that_cannot_fit_are_pruned_with_reason_and_constraint_never_run(tmp_path: Path, store: Store) -> None:
    precision = workload().train.precision
    small, big = (shortcut_config(micro, 64 // micro, precision, 0, "none", "none") for micro in (1, 64))
    fits = estimate(workload(), small).gpu_total
    memory = int(fits * 1.5)
    assert estimate(workload(), big).gpu_total > memory  # the big micro-batch cannot fit
    events: list[Event] = []
    study = TuningStudy(settings(tmp_path, micros=[1, 64], trials=6, work=workload(memory)), store, events.append)
    fake = FakeMeasurer()
    report = study.run(fake)

    assert {shape(config) for config in fake.submitted} == {(0, 1)}  # the big one never ran
    pruned = store.trials(study.study_id, status="pruned")
    assert len(pruned) == 1 and report.counts["pruned"] == 1 and report.counts["ok"] == 1
    trial = pruned[0]
    assert trial.prune_reason.startswith("needs ")  # sizes for people, not raw bytes
    assert f" MiB of {format_bytes(memory)} GPU memory at the forward phase (5% margin" in trial.prune_reason
    assert str(memory) not in trial.prune_reason and "; largest: activations " in trial.prune_reason
    assert reason_key(trial.prune_reason) == "GPU memory · forward · activations"
    assert trial.constraint is not None and trial.constraint > 0 and trial.measurement is None
    assert any(e.status == "pruned" and e.reason == trial.prune_reason for e in events)
    frozen = optuna_trials(store)
    assert frozen[trial.number].state == TrialState.PRUNED
    assert frozen[trial.number].constraints == {"memory": trial.constraint}
    assert all(t.constraints["memory"] <= 0 for t in frozen if t.state == TrialState.COMPLETE)


def test_identical_configs_are_answered_from_the_record(tmp_path: Path, store: Store) -> None:
    events: list[Event] = []
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=8), store, events.append)
    fake = FakeMeasurer()
    report = study.run(fake)

    shapes = [shape(config) for config in fake.submitted]
    assert sorted(shapes) == [(0, 1), (0, 2)]  # two configs, each run once however often they were proposed
    assert len(store.trials(study.study_id)) == 2 and report.exhausted  # the space holds 2 of the 8 asked for
    frozen = optuna_trials(store)
    assert sum(e.status == "duplicate" for e in events) == len(frozen) - 2 >= REPEAT_LIMIT
    assert all(t.state == TrialState.COMPLETE for t in frozen)
    recorded = {t.number: t.tokens_per_s for t in store.trials(study.study_id)}
    assert {t.values[0] for t in frozen} == set(recorded.values())


def test_each_outcome_is_recorded_and_told(tmp_path: Path, store: Store) -> None:
    """ok with tokens/s, oom (infeasible from now on, calibration told), error, timeout, a failing dispatcher."""
    script: dict[tuple[int, int], Any] = {
        (0, 1): None,  # ok
        (0, 2): Measurement(status="oom", error="DefaultCPUAllocator: can't allocate"),
        (1, 1): Measurement(status="error", exception_type="RuntimeError", error="boom"),
        (1, 2): Measurement(status="timeout", error="no step within 600 s"),
        (2, 1): ConnectionError("Ray unreachable"),
    }
    fake = FakeMeasurer(lambda config: script.get(shape(config)) or ok(config))
    study = TuningStudy(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=12), store)
    study.run(fake)

    by_shape = {shape(t.ds_config): t for t in store.trials(study.study_id)}
    assert set(script) <= set(by_shape)
    assert by_shape[(0, 1)].status == "ok" and by_shape[(0, 1)].tokens_per_s == 1001.0
    assert by_shape[(0, 1)].peak_bytes == 10 * MiB
    assert [by_shape[s].status for s in [(0, 2), (1, 1), (1, 2), (2, 1)]] == ["oom", "error", "timeout", "error"]
    assert by_shape[(1, 1)].error == "boom" and "Ray unreachable" in by_shape[(2, 1)].error
    assert by_shape[(2, 1)].measurement["exception_type"] == "ConnectionError"
    assert len(fake.submitted) == len(by_shape)  # nothing failed was run twice
    frozen = optuna_trials(store)
    for trial in by_shape.values():
        told = frozen[trial.number]
        assert told.state == (TrialState.COMPLETE if trial.status == "ok" else TrialState.FAIL)
    assert frozen[by_shape[(0, 2)].number].constraints == {"memory": 1.0}  # the sampler learns an OOM is infeasible
    calibration = store.get_calibration("cpu", workload().model.family)
    assert calibration is not None and calibration.stats["ooms"] == 1 and calibration.margin >= DEFAULT_MARGIN


def test_a_run_whose_measured_peak_exceeds_the_target_gpu_is_oom_and_never_best(tmp_path: Path, store: Store) -> None:
    """CPU ranks have no wall at --gpu-memory: a config that trained but peaked above it would run out of memory on a
    GPU of that size. It is recorded oom with both figures and its measurement kept, told infeasible, never best."""
    budget = 64 * 2**30

    def outcome(config: dict[str, Any]) -> Measurement:
        measured = ok(config)
        if shape(config) == (1, 2):  # the fastest config: 2002 tokens/s, over the budget by a byte
            measured.peak_bytes_per_rank = [budget + 1]
        return measured

    study = TuningStudy(settings(tmp_path, stages=[0, 1], micros=[1, 2], trials=4), store)
    study.run(FakeMeasurer(outcome))
    by_shape = {shape(t.ds_config): t for t in store.trials(study.study_id)}
    over = by_shape[(1, 2)]
    assert over.status == "oom" and over.tokens_per_s == 2002.0 and over.peak_bytes == budget + 1
    assert "exceeds the 64.00 GiB the study targets (--gpu-memory) by 1 B:" in (over.error or "")
    from tuner.study.outcome import measured_over

    assert "by 9.7 MiB: a GPU" in (measured_over(64 * 2**20 + 10_216_368, 64 * 2**20) or "")  # not 10,216,368 bytes
    assert optuna_trials(store)[over.number].constraints == {"memory": 1.0}
    best = store.best_trial(study.study_id)
    assert best is not None and shape(best.ds_config) == (1, 1)


def test_a_trial_a_killed_process_left_running_is_failed_and_retried_once(tmp_path: Path, store: Store) -> None:
    def crash_while_running(fake: FakeMeasurer) -> None:
        """The loop dies with a run in flight (as a killed process would leave it): the trial stays running."""
        study = TuningStudy(settings(tmp_path, trials=4), store)
        with pytest.raises(ConnectionError):
            study.run(fake, should_stop=stop_when(lambda: bool(fake.hanging), ConnectionError("database gone")))
        assert fake.cancelled  # no run goes on behind a loop that failed

    first = FakeMeasurer(lambda config: HANG)
    crash_while_running(first)
    [stale] = store.trials(store.get_study("logic").id, status="running")
    assert stale.attempts == 1 and shape(first.submitted[0]) == shape(stale.ds_config)

    resumed = FakeMeasurer(lambda config: HANG if shape(config) == shape(stale.ds_config) else ok(config))
    crash_while_running(resumed)  # the retry is left running too
    assert shape(resumed.submitted[0]) == shape(stale.ds_config)  # retried first
    retried = store.get_trial(stale.id)
    assert retried.status == "running" and retried.attempts == 2

    last = FakeMeasurer()
    study = TuningStudy(settings(tmp_path, trials=4), store)
    study.run(last)
    assert shape(stale.ds_config) not in {shape(config) for config in last.submitted}  # retried once, not twice
    final = store.get_trial(stale.id)
    assert final.status == "failed" and final.attempts == 2
    assert not store.trials(study.study_id, status=("running", "pending"))
    assert not [t for t in optuna_trials(store) if t.state == TrialState.RUNNING]


def test_a_stale_trial_retried_after_resume_is_measured(tmp_path: Path, store: Store) -> None:
    first = FakeMeasurer(lambda config: HANG)
    study = TuningStudy(settings(tmp_path, trials=2), store)
    with pytest.raises(ConnectionError):
        study.run(first, should_stop=stop_when(lambda: bool(first.hanging), ConnectionError("killed")))

    again = FakeMeasurer()
    study = TuningStudy(settings(tmp_path, trials=2), store)
    study.run(again)
    assert shape(again.submitted[0]) == shape(first.submitted[0])
    [record] = [t for t in store.trials(study.study_id) if shape(t.ds_config) == shape(first.submitted[0])]
    assert record.status == "ok" and record.attempts == 2
    frozen = optuna_trials(store)
    assert frozen[0].state == TrialState.FAIL and len(store.trials(study.study_id)) == 2


def lost_node(config: dict[str, Any], why: str = "its Ray node or actor was lost mid-run") -> Measurement:
    return Measurement(status="error", exception_type=INFRA_LOST, error=f"rank 1: {why}")


@pytest.mark.parametrize(
    "why", ["its Ray node or actor was lost mid-run", "its node's fork server was lost mid-run (closed the connection)"]
)
def test_a_run_that_lost_its_infrastructure_is_measured_again_at_once(tmp_path: Path, store: Store, why: str) -> None:
    """The node's, actor's or fork server's failure, not the config's: recorded failed, queued again, and measured on
    the next run."""
    lost: list[tuple[int, int]] = []

    def outcome(config: dict[str, Any]) -> Measurement:
        if not lost:
            lost.append(shape(config))
            return lost_node(config, why)
        return ok(config)

    events: list[Event] = []
    fake = FakeMeasurer(outcome)
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store, events.append)
    report = study.run(fake)

    shapes = [shape(config) for config in fake.submitted]
    assert shapes[:2] == [lost[0], lost[0]] and sorted(set(shapes)) == [(0, 1), (0, 2)]
    [record] = [t for t in store.trials(study.study_id) if shape(t.ds_config) == lost[0]]
    assert (record.status, record.attempts) == ("ok", 2) and report.counts["ok"] == 2
    assert any(e.status == "failed" and "queued to run again" in (e.reason or "") for e in events)


def test_a_config_whose_node_is_lost_twice_is_not_retried_a_third_time(tmp_path: Path, store: Store) -> None:
    fake = FakeMeasurer(lambda config: lost_node(config) if shape(config) == (0, 1) else ok(config))
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store)
    study.run(fake)
    assert [shape(config) for config in fake.submitted].count((0, 1)) == 2
    [record] = [t for t in store.trials(study.study_id) if shape(t.ds_config) == (0, 1)]
    assert (record.status, record.attempts) == ("failed", 2)


def test_an_interrupted_study_resumes_without_measuring_anything_again(tmp_path: Path, store: Store) -> None:
    def first_two_then_hang(config: dict[str, Any]) -> Any:
        return ok(config) if len(fake.submitted) <= 2 else HANG

    fake = FakeMeasurer(first_two_then_hang)
    study = TuningStudy(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=6), store)
    report = study.run(fake, should_stop=stop_when(lambda: bool(fake.hanging), KeyboardInterrupt()))  # Ctrl-C
    assert report.interrupted
    before = {t.config_key: t for t in store.trials(study.study_id)}
    measured = {key: t for key, t in before.items() if t.status == "ok"}
    assert len(measured) == 2
    [cut] = [t for t in before.values() if t.status != "ok"]
    assert cut.status == "failed" and cut.error == "interrupted by the user"

    again = FakeMeasurer()
    resumed = TuningStudy(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=6), store)
    report = resumed.run(again)
    assert not report.interrupted and len(store.trials(study.study_id)) == 6  # all 6 configs of the space
    remeasured = {shape(config) for config in again.submitted} & {shape(t.ds_config) for t in measured.values()}
    assert not remeasured
    for key, trial in measured.items():
        after = store.find_trial_by_key(study.study_id, key)
        assert (after.status, after.tokens_per_s, after.attempts) == ("ok", trial.tokens_per_s, 1)


def test_the_budget_buys_distinct_configs(tmp_path: Path, store: Store) -> None:
    """--trials N records N distinct configs; proposals that repeat one are answered from its record, for free."""
    fake = FakeMeasurer()
    study = TuningStudy(settings(tmp_path, stages=[0, 1, 2, 3], micros=[1, 2, 4], trials=8), store)
    report = study.run(fake)
    keys = [t.config_key for t in store.trials(study.study_id)]
    assert len(keys) == len(set(keys)) == 8 == study.configs_recorded() == sum(report.counts.values())
    assert len({shape(config) for config in fake.submitted}) == len(fake.submitted)  # nothing measured twice
    assert len(optuna_trials(store)) >= 8 and not report.exhausted


def test_an_exhausted_space_ends_and_says_so(tmp_path: Path, store: Store) -> None:
    fake = FakeMeasurer()
    study = TuningStudy(settings(tmp_path, stages=[0, 1], micros=[1], trials=10), store)
    report = study.run(fake)
    assert report.exhausted
    assert len(store.trials(study.study_id)) == 2 == len(fake.submitted)
    assert len(optuna_trials(store)) >= 2 + REPEAT_LIMIT


def test_timeout_stops_asking_and_keeps_what_finished(tmp_path: Path, store: Store) -> None:
    fake = FakeMeasurer(delay_s=0.2)
    study = TuningStudy(settings(tmp_path, stages=[0, 1, 2, 3], micros=[1, 2, 4], trials=50, timeout_s=0.5), store)
    report = study.run(fake)
    assert 1 <= len(fake.submitted) < 12 and len(optuna_trials(store)) < 50
    assert not report.stopped and not report.interrupted
    assert report.counts["ok"] == len(fake.submitted)  # the run in flight at the deadline finished and was recorded


def test_should_stop_kills_the_run_in_flight_and_records_it_failed(tmp_path: Path, store: Store) -> None:
    fake = FakeMeasurer(lambda config: HANG)
    study = TuningStudy(settings(tmp_path, trials=4), store)
    report = study.run(fake, should_stop=stop_when(lambda: bool(fake.hanging)))
    assert report.stopped and fake.cancelled and len(fake.submitted) == 1
    [trial] = store.trials(study.study_id)
    assert trial.status == "failed" and trial.error == "cancelled: the study was stopped"
    assert [t.state for t in optuna_trials(store)] == [TrialState.FAIL]


@pytest.mark.parametrize("early_stop", [SlowRunStopper(fraction=0.5, min_steps=2), None])
def test_a_run_clearly_slower_than_the_best_is_stopped_early(
    tmp_path: Path, store: Store, early_stop: SlowRunStopper | None
) -> None:
    """Micro-batch 1 runs first at 4096 tokens/s (1 s steps); micro-batch 2 takes 10 s steps: stopped after two."""
    script = {(0, 1): [1.0, 1.0, 1.0], (0, 2): [10.0, 10.0, 10.0]}
    fake = FakeMeasurer(lambda config: script[shape(config)])
    study = TuningStudy(settings(tmp_path, trials=2, early_stop=early_stop), store)
    study.optuna.enqueue_trial({"stage": 0, "micro_batch": 1})
    study.optuna.enqueue_trial({"stage": 0, "micro_batch": 2})
    events: list[Event] = []
    study.on_event = events.append
    study.run(fake)

    by_shape = {shape(t.ds_config): t for t in store.trials(study.study_id)}
    fast, slow = by_shape[(0, 1)], by_shape[(0, 2)]
    assert fast.status == "ok" and fast.tokens_per_s == pytest.approx(4096.0) and not fast.measurement["stopped_early"]
    frozen = optuna_trials(store)
    assert frozen[fast.number].state == TrialState.COMPLETE
    assert fake.hooked == [early_stop is not None] * 2
    if early_stop is None:  # measured to the end, told complete
        assert slow.status == "ok" and not slow.measurement["stopped_early"]
        assert frozen[slow.number].state == TrialState.COMPLETE
        return
    # stopped after two steps: recorded ok with its partial figures, distinct from memory pruning, told PRUNED
    assert slow.status == "ok" and slow.measurement["stopped_early"] is True and slow.prune_reason is None
    assert slow.measurement["ranks"][0]["step_times"] == [10.0, 10.0]
    assert slow.tokens_per_s == pytest.approx(409.6)
    assert frozen[slow.number].state == TrialState.PRUNED
    assert frozen[slow.number].intermediate_values == {0: pytest.approx(409.6), 1: pytest.approx(409.6)}
    assert [e.status for e in events if e.number == slow.number][-1] == "stopped_early"
    assert store.best_trial(study.study_id).number == fast.number


def test_the_best_so_far_survives_a_resume(tmp_path: Path, store: Store) -> None:
    """A resumed study stops slow runs against the best recorded before it stopped."""
    first = TuningStudy(settings(tmp_path, trials=1), store)
    first.optuna.enqueue_trial({"stage": 0, "micro_batch": 1})
    first.run(FakeMeasurer(lambda config: [1.0, 1.0, 1.0]))
    again = TuningStudy(settings(tmp_path, trials=2), store)
    assert again.best_tokens_per_s == pytest.approx(4096.0)
    again.optuna.enqueue_trial({"stage": 0, "micro_batch": 2})
    again.run(FakeMeasurer(lambda config: [10.0, 10.0, 10.0]))
    slow = next(t for t in store.trials(again.study_id) if shape(t.ds_config) == (0, 2))
    assert slow.measurement["stopped_early"] is True


def test_cpu_studies_do_not_search_the_cuda_allocator_setting(tmp_path: Path, store: Store) -> None:
    cpu = TuningStudy(replace(settings(tmp_path), space_path=default_space_path()), store)
    assert "expandable_segments" in cpu.space.names and "expandable_segments" not in cpu.space.searched
    cuda_work = replace(workload(), cluster=ClusterSpec(gpus_per_node=1))
    cuda_settings = replace(settings(tmp_path), name="logic-cuda", workload=cuda_work, space_path=default_space_path())
    assert "expandable_segments" in TuningStudy(cuda_settings, store).space.searched


def test_threads_per_rank_are_searched_only_with_a_core_budget_and_within_it(tmp_path: Path, store: Store) -> None:
    """Without ``--search-threads`` the launch environment's rule gives the threads (null, pinned); with a budget of
    4 cores per node, two CPU ranks are offered 1 or 2 threads each (or the rule), never more than fit."""
    two = replace(workload(), cluster=ClusterSpec(gpus_per_node=2, device="cpu"))
    plain = TuningStudy(replace(settings(tmp_path), workload=two, space_path=default_space_path()), store)
    assert "threads_per_rank" not in plain.space.searched and plain.space.pins["threads_per_rank"] is None
    budget = replace(settings(tmp_path), name="threads", workload=two, space_path=default_space_path(), thread_budget=4)
    searched = TuningStudy(budget, store).space
    assert "threads_per_rank" in searched.searched
    assert searched.parameter("threads_per_rank").choices == (None, 1, 2)


def holders(study: TuningStudy) -> list[str]:
    """The study's holder attributes, read afresh from Optuna's tables."""
    attrs = optuna.load_study(study_name=study.settings.name, storage=study.store.url).user_attrs
    return [key for key in attrs if key.startswith(HOLDER_ATTR)]


def test_a_finished_run_leaves_no_holder_on_the_study(tmp_path: Path, store: Store) -> None:
    """The run's holder attribute exists while it runs (another process resuming the study sees it) and is gone once
    it ended; one a killed run left behind (its holder no longer alive) goes at the next run's start."""
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store)
    dead = new_holder()
    release(dead)  # as a process killed mid-run left it: not alive
    study.optuna.set_user_attr(HOLDER_ATTR + dead, True)
    seen: list[list[str]] = []

    def outcome(config: dict[str, Any]) -> Measurement:
        seen.append(holders(study))
        return ok(config)

    study.run(FakeMeasurer(outcome))
    assert seen and all(during == [HOLDER_ATTR + study.owner] for during in seen)
    assert holders(study) == []
    study.run(FakeMeasurer(outcome))  # a second run of the study: the same
    assert holders(study) == []


def test_ctrl_c_while_a_run_is_being_started_leaves_no_trial_running(tmp_path: Path, store: Store) -> None:
    """Ctrl-C lands after the trial is recorded running and before its run is held in flight (inside ``submit``): the
    loop takes it at its next step, so that run too is killed and recorded failed, not left running."""
    import os
    import signal

    def interrupting(config: dict[str, Any]) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # handled in this (the main) thread right after this call
        return HANG

    # as in a terminal: Python's own Ctrl-C handler, the one the loop defers (a test runner started in the background
    # by a script inherits SIGINT ignored, and Python then installs none)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store)
        report = study.run(FakeMeasurer(interrupting))
        assert report.interrupted
        [trial] = store.trials(study.study_id)
        assert (trial.status, trial.error) == ("failed", "interrupted by the user")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Python's own again
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_study_says_where_it_stands(tmp_path: Path, store: Store) -> None:
    """created → running while a run goes on → finished (or interrupted when it was stopped)."""
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store)
    assert store.get_study(study.study_id).status == "created"
    seen: list[str] = []

    def outcome(config: dict[str, Any]) -> Measurement:
        seen.append(store.get_study(study.study_id).status)
        return ok(config)

    study.run(FakeMeasurer(outcome))
    assert seen and set(seen) == {"running"}
    assert store.get_study(study.study_id).status == "finished"
    study.run(FakeMeasurer(), should_stop=lambda: True)
    assert store.get_study(study.study_id).status == "interrupted"


def queued(store: Store) -> list[optuna.trial.FrozenTrial]:
    """Optuna's trials of the study still waiting to be asked, or asked and never told."""
    return [t for t in optuna_trials(store) if t.state in (TrialState.WAITING, TrialState.RUNNING)]


def test_a_config_a_kill_interrupted_is_retried_before_the_warm_start_and_within_the_budget(
    tmp_path: Path, store: Store
) -> None:
    """Kill ``dstune tune --trials 2`` during trial 0 and run it again: the interrupted config is measured first, ahead
    of the rest of the warm start, and its retry uses no second share of the budget (it was ``failed 1, ok 1``, the
    retry left waiting in Optuna for ever behind the warm start that filled the budget)."""
    guided = replace(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=2), sampler="tpe")
    first = FakeMeasurer(lambda config: HANG)
    with pytest.raises(ConnectionError):
        TuningStudy(guided, store).run(first, should_stop=stop_when(lambda: bool(first.hanging), ConnectionError()))
    assert [t.state for t in queued(store)].count(TrialState.WAITING) >= 1  # the rest of the warm start waits

    again = FakeMeasurer()
    study = TuningStudy(guided, store)
    report = study.run(again)
    assert shape(again.submitted[0]) == shape(first.submitted[0])  # the interrupted config first
    assert {status: n for status, n in report.counts.items() if n} == {"ok": 2}
    [retried] = [t for t in store.trials(study.study_id) if shape(t.ds_config) == shape(first.submitted[0])]
    assert (retried.status, retried.attempts) == ("ok", 2)
    assert not [t for t in queued(store) if "dstune_retry" in t.user_attrs]  # no retry left waiting


def test_a_config_another_live_process_is_measuring_is_not_told_failed(tmp_path: Path, store: Store) -> None:
    """Another process (alive, holding its trial) measures micro-batch 1 when this one proposes it: Optuna is told
    PRUNED with the trial it repeats and why, not FAIL (Optuna's CLI and dashboard showed a failure for a config
    measured ok), and the config is not run here."""
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=2), store)
    other_process = new_holder()
    study.optuna.enqueue_trial({"stage": 0, "micro_batch": 1})
    theirs = study.optuna.ask()
    theirs.set_user_attr(OWNER_ATTR, other_process)
    suggestion = study.space.suggest(theirs, workload(), 64, None)
    params, config = suggestion.params, suggestion.trial.ds_config
    trial_id = store.add_trial(study.study_id, theirs.number, suggestion.key, config, params, False, None)
    store.start_trial(trial_id, owner=other_process, lease_s=120.0)
    study.optuna.enqueue_trial({"stage": 0, "micro_batch": 1})  # this process proposes the same config
    fake = FakeMeasurer()
    try:
        study.run(fake)
    finally:
        release(other_process)

    assert [shape(config) for config in fake.submitted] == [(0, 2)]
    repeats = [t for t in optuna_trials(store) if t.params == params and t.number != theirs.number]
    assert repeats and all(t.state == TrialState.PRUNED for t in repeats)
    assert all(t.user_attrs[DUPLICATE_ATTR] == theirs.number for t in repeats)
    assert all("another process" in t.user_attrs[REASON_ATTR] for t in repeats)
    assert store.get_trial(trial_id).status == "running"  # still theirs


def test_a_study_of_another_workload_is_refused_before_anything_is_written(tmp_path: Path, store: Store) -> None:
    """``tune --study NAME`` on another workload's study: refused naming the workload, and no stray workload row."""
    import sqlalchemy as sa

    from tuner.storage import StoreError
    from tuner.storage.tables import WorkloadRow

    def workloads() -> list[str]:
        with store.session(write=False) as session:
            return list(session.scalars(sa.select(WorkloadRow.fingerprint)))

    TuningStudy(settings(tmp_path), store)
    before = workloads()
    other = replace(settings(tmp_path), workload=workload(gpu_memory=32 * 2**30))
    with pytest.raises(StoreError) as refused:
        TuningStudy(other, store)
    assert refused.value.field == "workload" and "choose another study name" in refused.value.message
    assert workloads() == before


def test_a_disk_filling_mid_study_ends_it_as_disk_full_and_a_rerun_loses_nothing(tmp_path: Path, store: Store) -> None:
    """The database's disk fills while the third config is measured (SQLite's own ``max_page_count``: the next write
    that grows the file fails with "database or disk is full", as on a full filesystem). The study stops with an
    error the CLI reports as one ``disk full`` line; the file stays intact, and a rerun once there is room again
    measures the interrupted config and finishes the study."""
    from sqlalchemy import event

    from tuner.storage.environment import environment_failure

    def cap(dbapi_connection: Any, _record: Any) -> None:
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

    def fill_on_third(config: dict[str, Any]) -> Measurement:
        if len(first.submitted) == 3:
            store.engine.dispose()
            event.listen(store.engine, "connect", cap)
        return ok(config)

    first = FakeMeasurer(fill_on_third)
    with pytest.raises(Exception) as raised:
        TuningStudy(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=6), store).run(first)
    failure = environment_failure(raised.value)
    assert failure is not None and "disk full" in str(failure), repr(raised.value)

    event.remove(store.engine, "connect", cap)  # room again
    store.engine.dispose()
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    study = TuningStudy(settings(tmp_path, stages=[0, 1, 2], micros=[1, 2], trials=6), store)
    study.run(FakeMeasurer())
    trials = store.trials(study.study_id)
    assert shape(first.submitted[2]) in {shape(t.ds_config) for t in trials if t.status == "ok"}  # not lost
    assert len(trials) == 6 and all(t.status == "ok" for t in trials)
    assert not [t for t in optuna_trials(store) if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_cuda_calibration_compares_max_memory_allocated_with_the_estimates_allocated_part(
    tmp_path: Path, store: Store
) -> None:
    """A CUDA run whose max_memory_allocated is exactly the estimate's tensors and cuBLAS workspaces: the ratio learned
    is 1, not allocated / (allocated + context + NCCL + reserve), which sank the margin to its floor."""
    work = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=1, gpu_memory=64 * 2**30, device="cuda"),
        TrainSpec(64),
    )

    def exact(config: dict[str, Any]) -> Measurement:
        estimated = estimate(work, TrialConfig(config))
        allocated = estimated.gpu_total - sum(
            size for name, size in estimated.overhead_terms.items() if name != "cublas_workspace"
        )
        assert allocated < estimated.gpu_total  # the context, NCCL and the reserve are in the total
        return replace(ok(config), peak_bytes_per_rank=[allocated])

    study = TuningStudy(settings(tmp_path, stages=[0, 1], micros=[1, 2], trials=4, work=work), store)
    study.run(FakeMeasurer(exact))
    calibration = store.get_calibration(work.cluster.hardware_key, work.model.family)
    assert calibration is not None and calibration.stats["ratios"], calibration
    assert all(abs(ratio - 1.0) < 1e-9 for ratio in calibration.stats["ratios"]), calibration.stats["ratios"]


def test_a_training_command_failing_on_its_own_stops_the_study_at_its_first_trial(tmp_path: Path, store: Store) -> None:
    """An import error, a missing data file, a bad flag: no config can fix it, so the study stops with its line
    instead of recording every config failed."""
    from tuner.measure.script.failures import SCRIPT_FAILED, ScriptFailed

    line = "FileNotFoundError: [Errno 2] No such file or directory: 'data.jsonl'"
    fake = FakeMeasurer(lambda config: Measurement(status="error", exception_type=SCRIPT_FAILED, error=line))
    study = TuningStudy(settings(tmp_path, micros=[1, 2], trials=4), store)
    with pytest.raises(ScriptFailed) as stopped:
        study.run(fake)
    assert stopped.value.message == line and len(fake.submitted) == 1
    assert {k: v for k, v in store.study_summary(study.study_id).counts.items() if v} == {"error": 1}
