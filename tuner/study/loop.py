"""The tuning loop: ask Optuna for a config, let the estimator prune it or dispatch it, record, tell; resumable.

One trial, end to end: the search space turns an Optuna trial into a ds_config; the estimator judges it
with the calibrated safety margin; a config that cannot fit is PRUNED with its reason and a positive constraint (so
the sampler learns the infeasible region) without any run; the others go to Ray for a short measured run; every
outcome lands in SQL, and measured peaks (and out-of-memory failures) move the margin for the next trials.

The loop ties the study room's parts: the proposer (:mod:`tuner.study.proposer`: warm start, retries, the sampler),
the gate (:mod:`tuner.study.gate`: recorded before? fits?), the stopper (:mod:`tuner.study.stopper`: budget,
timeout, early stop), the recorder (:mod:`tuner.study.outcome`: record and tell) and the holding
(:mod:`tuner.study.resume`).

Re-running a study name resumes it: trials a killed process left running are marked failed and retried once, and a
config already recorded in the study is never run again (its earlier outcome is told to Optuna instead). Several
processes may run one study at once: each holds the trials it runs (owner process and a renewed lease), so resuming
fails only trials nobody holds, and a config another process recorded or started meanwhile is not run again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from typing import Literal

import optuna
from optuna.trial import TrialState

from tuner.forecast import Calibration, ThroughputGuide, largest_micro_first
from tuner.measure.measurement import CANCELLED, Measurement
from tuner.measure.script.failures import SCRIPT_FAILED, ScriptFailed
from tuner.space import InfeasibleConfig, SearchSpace, Suggestion
from tuner.space.numerics_choices import load_study_space
from tuner.storage import DuplicateConfig, Store, StoreError, StudyStatus, TrialRecord
from tuner.study.gate import Verdict, answered_by_record, judge
from tuner.study.measurer import Measurer
from tuner.study.memory_bound import OutOfMemory, pruned_by_oom
from tuner.study.optuna_storage import RetryingRDBStorage
from tuner.study.outcome import REASON_ATTR, Recorder, Run, load_calibration
from tuner.study.pin_checks import refuse_unmeasurable_pins
from tuner.study.proposer import Proposer
from tuner.study.resume import TRIAL_LEASE_S, Holding
from tuner.study.samplers import grid_parameters, make_sampler
from tuner.study.settings import Event, StudyReport, StudySettings
from tuner.study.stopper import STOP_WAIT_S, Budget, best_stood, defer_ctrl_c, step_hook
from tuner.workload.trial import ENV_SECTION

UNKNOWN_LENGTH = (
    "the command's forward took no token ids and no --seq-len was given: its samples/s were measured, but a study "
    "ranks configs by tokens/s; give --seq-len (tokens per sample)"
)
THREADS_KEY = f"{ENV_SECTION}.threads_per_rank"  # the runner sets each rank's OMP_NUM_THREADS to it


class TuningStudy:
    """Runs the ask → estimate → prune or measure → record → tell loop for one study."""

    def __init__(self, settings: StudySettings, store: Store, on_event: Callable[[Event], None] | None = None) -> None:
        self.settings, self.store, self.on_event = settings, store, on_event or (lambda event: None)
        self.space = _study_space(settings)
        workload = settings.workload
        refuse_unmeasurable_pins(self.space, workload)  # before anything is written
        hardware = workload.cluster.hardware_key
        calibration = load_calibration(store, hardware, workload.model.family)
        _refuse_another_workload(store, settings)  # before anything is written
        workload_id = store.upsert_workload(workload)
        self.study_id = store.get_or_create_study(settings.name, workload_id, settings.sampler, settings.to_record()).id
        directions: list[Literal["maximize", "minimize"]] = (
            ["maximize", "minimize"] if settings.pareto else ["maximize"]
        )
        self.storage = RetryingRDBStorage(store.url, retry_s=store.retry_s)
        self.optuna = optuna.create_study(
            study_name=settings.name,
            storage=self.storage,
            directions=directions,
            sampler=make_sampler(settings.sampler, self.space, settings),
            load_if_exists=True,
        )
        self.in_flight: dict[Future[Measurement], Run] = {}
        # the throughput model: a new study measures its best-predicted configs first, then its picks between the
        # sampler's proposals; the baselines (random, grid) stay unguided
        self.guide = ThroughputGuide(
            self.space,
            workload,
            calibration,
            global_batch=settings.global_batch,
            nvme_path=settings.nvme_path,
            store=store,
            hardware=hardware,
        )
        # a command's own model (no --model): nothing to predict with, so the largest micro-batch of each stage first
        first = None
        if workload.model.is_unknown:
            first = largest_micro_first(self.space, workload, settings.global_batch, settings.nvme_path)
        self.proposer = Proposer(self.optuna, self.guide, guided=settings.sampler in ("tpe", "gp"), first=first)
        self.recorder = Recorder(
            settings, store, self.study_id, self.optuna, self.guide, calibration, self.proposer, self._emit
        )
        self.holding = Holding(self.optuna, self.storage, store, self.study_id)

    @property
    def owner(self) -> str:
        """The holder of the trials the current (or last) run started."""
        return self.holding.owner

    @property
    def calibration(self) -> Calibration:
        """The memory margin as calibrated so far."""
        return self.recorder.calibration

    @property
    def best_tokens_per_s(self) -> float | None:
        """The best measured throughput of the study so far (what the early stop compares runs with)."""
        return self.recorder.best_tokens_per_s

    def configs_recorded(self) -> int:
        """Distinct configs the study holds so far, measured, pruned or in flight: what the budget counts."""
        return self.store.count_trials(self.study_id)

    def settled(self) -> bool:
        """True once the best measured config stood for ``patience`` measured trials after it (the study's rule for
        stopping when more trials are unlikely to beat it: :attr:`StudySettings.patience`)."""
        patience = self.settings.patience
        if not patience:
            return False
        best = self.store.best_trial(self.study_id)
        measured = [t.number for t in self.store.trials(self.study_id, status="ok")]
        return best_stood(measured, best.number if best is not None else None) >= patience

    def recover(self) -> None:
        """Fail what a killed process left running, in Optuna and in the store, and queue each for one retry; what
        another live process holds is left alone."""
        for trial_id in self.holding.fail_stale():
            record = self.store.get_trial(trial_id)
            if record is not None:
                self.proposer.queue_retry(record)

    def run(self, dispatcher: Measurer, should_stop: Callable[[], bool] | None = None) -> StudyReport:
        """Run until the study holds ``trials`` distinct configs (measured or pruned), the timeout passes, the space
        has no new config to offer (:data:`~tuner.study.stopper.REPEAT_LIMIT` proposals in a row repeat recorded
        ones: ``report.exhausted``) or ``should_stop()`` says so. A proposal identical to a recorded config is told
        that config's outcome and uses none of the budget.

        ``dispatcher`` measures the configs that fit: the real :class:`~tuner.measure.dispatch.Dispatcher`, or any
        :class:`~tuner.study.measurer.Measurer`.

        ``should_stop`` is asked before each trial and at least once a second while runs are in flight; when it says
        stop, the runs in flight are killed and recorded failed (``report.stopped``). Ctrl-C stops the same way,
        without waiting for the killed runs (``report.interrupted``). What finished is always recorded.
        """
        self.holding.begin()
        self.store.set_study_status(self.study_id, StudyStatus.RUNNING)
        self.recover()
        self.proposer.warm_start()
        budget = Budget(self.settings.trials, self.settings.timeout_s)
        interrupted = stopped = False
        restore_ctrl_c = defer_ctrl_c(ctrl_c := threading.Event())
        try:
            stopped = self._loop(dispatcher, budget, ctrl_c, should_stop)
        except KeyboardInterrupt:
            interrupted = True
        except BaseException as error:  # the loop itself failed (database gone...): no run may go on behind it
            dispatcher.cancel()  # its trials stay running in the store; resuming fails them and retries (recover)
            _fail_unfinished(self.optuna, [run.trial for run in self.in_flight.values()], error)
            self.holding.release()  # so they are stale from now on, to this process too
            with contextlib.suppress(Exception):  # else the next run's recover removes it
                self.holding.drop()
                self.store.set_study_status(self.study_id, StudyStatus.FAILED)
            raise
        finally:
            restore_ctrl_c()
        if stopped or interrupted:
            reason = "interrupted by the user" if interrupted else "cancelled: the study was stopped"
            self._stop_in_flight(dispatcher, reason, wait_s=0.0 if interrupted else STOP_WAIT_S)
        self.holding.release()
        self.holding.drop()
        ended = StudyStatus.INTERRUPTED if stopped or interrupted else StudyStatus.FINISHED
        self.store.set_study_status(self.study_id, ended)
        counts = self.store.study_summary(self.study_id).counts
        ended_by = {"stopped": stopped, "exhausted": budget.exhausted, "settled": self.settled()}
        return StudyReport(self.study_id, interrupted, counts, **ended_by)

    def _loop(
        self, dispatcher: Measurer, budget: Budget, ctrl_c: threading.Event, should_stop: Callable[[], bool] | None
    ) -> bool:
        """Ask and dispatch while the budget allows and a slot is free, else wait for a run to finish; True when
        ``should_stop`` ended it."""
        while not (should_stop is not None and should_stop()):
            if ctrl_c.is_set():
                raise KeyboardInterrupt  # Ctrl-C, taken here: never between a trial started and its run held
            if (
                len(self.in_flight) < dispatcher.slots
                and budget.may_ask(self.configs_recorded, self.proposer.retry_waiting)
                and not self.settled()
            ):
                budget.proposed(self._ask_one(dispatcher))
                continue
            if not self.in_flight:
                return False
            self.holding.renew([run.trial_id for run in self.in_flight.values()])
            done, _ = wait(list(self.in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
            for future in done:
                self._finish(future)
        return True

    def _ask_one(self, dispatcher: Measurer) -> bool:
        """Ask for one config and prune, dispatch or answer it; False when it repeats a recorded config. An error on
        the way fails the trial in Optuna before it goes on up: no trial is left running there."""
        trial = self.proposer.ask(self.holding.owner)
        try:
            return self._prune_or_dispatch(dispatcher, trial)
        except BaseException as error:
            _fail_unfinished(self.optuna, [trial], error)
            raise

    def _prune_or_dispatch(self, dispatcher: Measurer, trial: optuna.Trial) -> bool:
        """:meth:`_ask_one` for an asked ``trial``."""
        workload = self.settings.workload
        try:
            suggestion = self.space.suggest(trial, workload, self.settings.global_batch, self.settings.nvme_path)
        except InfeasibleConfig as infeasible:
            trial.set_constraint("memory", 1.0)
            return self.recorder.tell_infeasible(trial, infeasible.reason)
        previous = self.store.find_trial_by_key(self.study_id, suggestion.key)
        if previous is not None and answered_by_record(previous):
            self.recorder.tell_previous(trial, previous)
            return False
        verdict = judge(workload, suggestion.trial, self.recorder.calibration)
        if verdict.reason is None and self.settings.dispatch.script is not None:
            verdict = self._learned_bound(verdict, suggestion)
        if verdict.reason is not None:
            trial.set_constraint("memory", verdict.constraint)
            self.recorder.tell_pruned(trial, suggestion, verdict.reason, est=verdict.estimate)
            return True
        return self._dispatch(dispatcher, trial, suggestion, verdict, previous)

    def _learned_bound(self, verdict: Verdict, suggestion: Suggestion) -> Verdict:
        """A training command's study: a config that needs at least as much memory as one that ran out of memory
        in this study is pruned too (:mod:`tuner.study.memory_bound`), whatever the estimate said."""
        failures = [OutOfMemory(t.number, t.trial) for t in self.store.trials(self.study_id, status="oom")]
        reason = pruned_by_oom(suggestion.trial, failures, self.settings.workload.cluster.device)
        return verdict if reason is None else replace(verdict, reason=reason, constraint=1.0)

    def _dispatch(
        self,
        dispatcher: Measurer,
        trial: optuna.Trial,
        suggestion: Suggestion,
        verdict: Verdict,
        previous: TrialRecord | None,
    ) -> bool:
        """Record the config running (a retry reuses its record) and start its run; False when another process on
        this study recorded or started the same config meanwhile (it runs there: answered from its record)."""
        try:
            if previous is not None:
                trial_id = previous.id
                self.store.retry_trial(trial_id, trial.number)
            else:
                trial_id = self.recorder.record(
                    trial, suggestion, verdict.estimate, "pending", constraint=verdict.constraint
                )
            self.store.start_trial(trial_id, owner=self.holding.owner, lease_s=TRIAL_LEASE_S)
        except (DuplicateConfig, StoreError):
            recorded = self.store.find_trial_by_key(self.study_id, suggestion.key)
            if recorded is None:
                raise
            self.recorder.tell_previous(trial, recorded)
            return False
        workload = self.settings.workload
        stopper, trial_config = self.settings.early_stop, suggestion.trial
        if self.settings.dispatch.seq_len_known:
            hook = step_hook(stopper, workload, trial_config, lambda: self.best_tokens_per_s)
        else:  # tokens per sample known only after a run (a command's own model, no --seq-len): judged in samples/s
            hook = step_hook(stopper, workload, trial_config, lambda: self.recorder.best_samples_per_s, per_sample=1.0)
        future = dispatcher.submit(workload, suggestion.trial, on_step=hook)
        self.in_flight[future] = Run(trial, trial_id, suggestion, verdict.estimate, verdict.constraint)
        self._emit(Event(trial.number, "running"))
        return True

    def _finish(self, future: Future[Measurement]) -> None:
        run = self.in_flight[future]
        try:
            measurement = future.result()
        except Exception as error:  # the dispatcher itself failed (Ray unreachable...): record, never lose it
            measurement = Measurement(status="error", exception_type=type(error).__name__, error=str(error))
        self.recorder.finish(run, measurement)
        del self.in_flight[future]  # only once recorded: a failure to record leaves it for run()'s failure handling
        if measurement.exception_type == SCRIPT_FAILED:  # the user's command failed on its own: no config can help
            raise ScriptFailed(measurement.error or "the training command failed")
        if measurement.status == "ok" and measurement.tokens_per_s is None and not measurement.stopped_early:
            raise ScriptFailed(UNKNOWN_LENGTH)

    def _stop_in_flight(self, dispatcher: Measurer, reason: str, wait_s: float) -> None:
        """Kill the runs in flight, wait up to ``wait_s`` for them to end, and record each failed with ``reason``;
        a run that finished before it was killed is recorded as measured."""
        dispatcher.cancel()
        if self.in_flight and wait_s > 0:
            wait(list(self.in_flight), timeout=wait_s)
        for future, run in list(self.in_flight.items()):
            if _measured_before_stop(future):
                self._finish(future)
                continue
            self.recorder.fail(run, reason)
        self.in_flight.clear()

    def _emit(self, event: Event) -> None:
        self.on_event(event)


def _study_space(settings: StudySettings) -> SearchSpace:
    """The study's search space (with the numerics choices under ``--allow-numerics-changes``): CUDA-only settings
    pinned off on CPU; the grid sampler's parameters only."""
    allowed, script = settings.allow_numerics_changes, settings.dispatch.script is not None  # the numerics choices
    space = load_study_space(settings.space_path, settings.pins, settings.workload, allowed, script)
    if settings.workload.cluster.device == "cpu" and "expandable_segments" in space.searched:
        space = space.with_pins({"expandable_segments": None})  # a CUDA allocator setting: nothing to try on CPU
    space = _thread_choices(space, settings)
    return space.restricted(list(grid_parameters(space))) if settings.sampler == "grid" else space


def _thread_choices(space: SearchSpace, settings: StudySettings) -> SearchSpace:
    """Threads per rank searched only with a core budget (``tune --search-threads``), and then only the counts whose
    ranks fit a node's budget; otherwise the launch environment's rule (null)."""
    name = next((p.name for p in space.parameters if p.key == THREADS_KEY and p.name in space.searched), None)
    if name is None:
        return space
    budget = settings.thread_budget
    if budget is None:
        return space.with_pins({name: None})
    ranks = settings.workload.cluster.gpus_per_node
    return space.with_choices(name, lambda threads: threads is None or threads * ranks <= budget)


def _refuse_another_workload(store: Store, settings: StudySettings) -> None:
    """A study of that name searches another workload: :class:`StoreError` (field ``workload``), raised before the
    study writes anything (its workload row included)."""
    existing = store.get_study(settings.name)
    if existing is None:
        return
    stored = store.get_workload(existing.workload_id).fingerprint
    given = settings.workload.fingerprint()
    if stored != given:
        raise StoreError(
            "workload",
            f"study {settings.name!r} was created for workload {existing.workload_id} ({stored}), not this one "
            f"({given}); choose another study name",
        )


def _fail_unfinished(study: optuna.Study, trials: list[optuna.Trial], error: BaseException) -> None:
    """Tell Optuna each of ``trials`` not finished yet failed, with ``error`` as its reason (best effort: the error
    may be the database's own)."""
    for trial in trials:
        with contextlib.suppress(Exception):
            if study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
                trial.set_user_attr(REASON_ATTR, f"the study failed: {type(error).__name__}: {error}")
                study.tell(trial, state=TrialState.FAIL)


def _measured_before_stop(future: Future[Measurement]) -> bool:
    """True when the run ended on its own (not cancelled before it started, not killed by the stop)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    return future.result().exception_type != CANCELLED
