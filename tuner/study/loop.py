"""The tuning loop: ask Optuna for a config, let the estimator prune it or dispatch it, record, tell; resumable.

One trial, end to end (DESIGN.md): the search space turns an Optuna trial into a ds_config; the estimator judges it
with the calibrated safety margin; a config that cannot fit is PRUNED with its reason and a positive constraint (so
the sampler learns the infeasible region) without any run; the others go to Ray for a short measured run; every
outcome lands in SQL, and measured peaks (and out-of-memory failures) move the margin for the next trials.

Re-running a study name resumes it: trials a killed process left running are marked failed and retried once, and a
config already recorded in the study is never run again (its earlier outcome is told to Optuna instead). Several
processes may run one study at once: each holds the trials it runs (owner process and a renewed lease), so resuming
fails only trials nobody holds, and a config another process recorded or started meanwhile is not run again.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from tuner.estimator import MemoryEstimate, estimate, resolve
from tuner.forecast import Calibration, ThroughputGuide, memory_reason, throughput_summary
from tuner.measure.measurement import CANCELLED, INFRA_LOST, Measurement
from tuner.measure.options import MeasureOptions
from tuner.space import InfeasibleConfig, SearchSpace, Suggestion, config_key, load_space
from tuner.storage import (
    DuplicateConfig,
    Store,
    StoreError,
    StudyStatus,
    TrialRecord,
    new_holder,
    owner_alive,
    release,
)
from tuner.study.early_stop import SlowRunStopper
from tuner.study.measurer import Measurer
from tuner.study.optuna_storage import RetryingRDBStorage
from tuner.workload import Workload

SAMPLERS = ("tpe", "random", "grid", "gp")
GRID_PARAMETERS = ("stage", "micro_batch")  # the DeepSpeed-autotuner-like baseline sweep
RETRIES = 1  # a trial left running by a killed process is run once more
STOP_WAIT_S = 60.0  # how long a stopped study waits for its killed runs to end before recording them
REPEAT_LIMIT = 100  # proposals in a row that repeat recorded configs before the space counts as exhausted
TRIAL_LEASE_S = 120.0  # a running trial's lease, renewed every quarter of it while its process lives
OWNER_ATTR = "dstune_owner"  # Optuna user attribute: the process that asked the trial
OWNERLESS_GRACE_S = 30.0  # an Optuna trial asked this recently may not carry its owner yet
HOLDER_ATTR = "dstune_holder:"  # Optuna study user attributes: every run of the study going on, by holder


@dataclass(frozen=True)
class StudySettings:
    """What one study searches and how long."""

    name: str
    workload: Workload
    space_path: Path
    pins: dict[str, Any] = field(default_factory=dict)
    global_batch: int | None = None
    sampler: str = "tpe"
    trials: int = 12
    timeout_s: float | None = None
    pareto: bool = False
    seed: int | None = None
    nvme_path: str | None = None
    dispatch: MeasureOptions = field(default_factory=MeasureOptions)
    early_stop: SlowRunStopper | None = field(default_factory=SlowRunStopper)  # None measures every run to the end

    def to_record(self) -> dict[str, Any]:
        """The settings stored with the study (JSON-ready)."""
        return {
            "space": str(self.space_path),
            "pins": self.pins,
            "global_batch": self.global_batch,
            "sampler": self.sampler,
            "pareto": self.pareto,
            "seed": self.seed,
            "nvme_path": self.nvme_path,
            "early_stop": None if self.early_stop is None else vars(self.early_stop),
        }


@dataclass
class Event:
    """What just happened to a trial, for progress displays."""

    number: int
    status: str
    tokens_per_s: float | None = None
    reason: str | None = None


@dataclass
class StudyReport:
    """The outcome of a run of the loop."""

    study_id: int
    interrupted: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    stopped: bool = False
    exhausted: bool = False  # the sampler kept proposing recorded configs: the space has no new ones to offer


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler without its ``study.stop()`` when the grid is exhausted.

    ``Study.stop`` only works inside ``study.optimize``; under ask-and-tell it raises from ``tell``. The loop stops on
    its own budget, and grid points proposed again are identical configs, told their recorded outcome.
    """

    def after_trial(self, study: Any, trial: Any, state: TrialState, values: Any) -> None:
        """Nothing to do: see the class docstring."""


def make_sampler(name: str, space: SearchSpace, settings: StudySettings) -> optuna.samplers.BaseSampler:
    """An Optuna sampler by name: TPE (multivariate), random, grid over stage × micro-batch, or GP."""
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, seed=settings.seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=settings.seed)
    if name == "grid":
        grid = space.grid(
            list(GRID_PARAMETERS),
            global_batch=settings.global_batch,
            world_size=settings.workload.cluster.world_size,
            nvme_path=settings.nvme_path,
        )
        return AskTellGridSampler(grid, seed=settings.seed)
    raise ValueError(f"sampler: must be one of {', '.join(SAMPLERS)}, got {name!r}")


def capacity_reason(est: MemoryEstimate, calibration: Calibration) -> str | None:
    """Why the estimate (with the margin) does not fit, as a sentence for people (:mod:`tuner.forecast`), or
    None when it fits."""
    reason = memory_reason(est, calibration)
    return None if reason is None else reason.sentence()


class TuningStudy:
    """Runs the ask → estimate → prune or measure → record → tell loop for one study."""

    def __init__(self, settings: StudySettings, store: Store, on_event: Callable[[Event], None] | None = None) -> None:
        self.settings, self.store, self.on_event = settings, store, on_event or (lambda event: None)
        space = load_space(settings.space_path, pins=settings.pins)
        if settings.workload.cluster.device == "cpu" and "expandable_segments" in space.searched:
            space = space.with_pins({"expandable_segments": None})  # a CUDA allocator setting: nothing to try on CPU
        self.space = space.restricted(list(GRID_PARAMETERS)) if settings.sampler == "grid" else space
        workload = settings.workload
        self.hardware = workload.cluster.hardware_key
        self.family = workload.model.family
        self.calibration = self._load_calibration()
        workload_id = store.upsert_workload(workload)
        self.study_id = store.get_or_create_study(settings.name, workload_id, settings.sampler, settings.to_record()).id
        directions: list[Literal["maximize", "minimize"]] = (
            ["maximize", "minimize"] if settings.pareto else ["maximize"]
        )
        self.owner = ""  # the holder of the trials a run starts: new in each run, released when it ends
        self._renewed_at = 0.0
        self.storage = RetryingRDBStorage(store.url, retry_s=store.retry_s)
        self.optuna = optuna.create_study(
            study_name=settings.name,
            storage=self.storage,
            directions=directions,
            sampler=make_sampler(settings.sampler, self.space, settings),
            load_if_exists=True,
        )
        # each run in flight: its trial, record id, suggestion, estimate and memory constraint (told with the outcome)
        self.in_flight: dict[Future[Measurement], tuple[optuna.Trial, int, Suggestion, MemoryEstimate, float]] = {}
        self.requeued: set[str] = set()  # config keys of runs lost with their infrastructure, queued again
        # the throughput model: a new study measures its best-predicted configs first, then its picks between the
        # sampler's proposals; the baselines (random, grid) stay unguided
        self.guided = settings.sampler in ("tpe", "gp")
        self.guide = ThroughputGuide(
            self.space,
            workload,
            self.calibration,
            global_batch=settings.global_batch,
            nvme_path=settings.nvme_path,
            store=store,
            hardware=self.hardware,
        )
        best = store.best_trial(self.study_id)  # what a run must not be clearly slower than (early stop)
        self.best_tokens_per_s: float | None = best.tokens_per_s if best is not None else None

    # ----------------------------------------------------------------- calibration
    def _load_calibration(self) -> Calibration:
        found = self.store.get_calibration(self.hardware, self.family)
        if found is None:
            return Calibration()
        stats = found.stats or {}
        return Calibration(margin=found.margin, ratios=tuple(stats.get("ratios", ())), ooms=int(stats.get("ooms", 0)))

    def _save_calibration(self) -> None:
        cal = self.calibration
        self.store.put_calibration(
            self.hardware, self.family, cal.margin, len(cal.ratios), {"ratios": list(cal.ratios), "ooms": cal.ooms}
        )

    # ----------------------------------------------------------------- resume
    def recover(self) -> None:
        """Fail what a killed process left running, in Optuna and in the store, and queue each for one retry; what
        another live process holds is left alone."""
        storage = self.optuna._storage
        stale_ids = self.store.mark_stale_running_failed(self.study_id)
        held = {t.number for t in self.store.trials(self.study_id, status="running")}
        holders = [key.removeprefix(HOLDER_ATTR) for key in self.optuna.user_attrs if key.startswith(HOLDER_ATTR)]
        for holder in holders:
            if owner_alive(holder) is False:  # a run that was killed before it could remove its own
                self.storage.delete_study_user_attr(self.optuna._study_id, HOLDER_ATTR + holder)
        others = any(holder != self.owner and owner_alive(holder) is not False for holder in holders)
        for trial in self.optuna.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not _optuna_trial_stale(trial, held, others):
                continue
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        for trial_id in stale_ids:
            record = self.store.get_trial(trial_id)
            if record is not None:
                self._queue_retry(record)

    # ----------------------------------------------------------------- the loop
    def run(self, dispatcher: Measurer, should_stop: Callable[[], bool] | None = None) -> StudyReport:
        """Run until the study holds ``trials`` distinct configs (measured or pruned), the timeout passes, the space
        has no new config to offer (:data:`REPEAT_LIMIT` proposals in a row repeat recorded ones: ``report.exhausted``)
        or ``should_stop()`` says so. A proposal identical to a recorded config is told that config's outcome and uses
        none of the budget.

        ``dispatcher`` measures the configs that fit: the real :class:`~tuner.measure.dispatch.Dispatcher`, or any
        :class:`~tuner.study.measurer.Measurer`.

        ``should_stop`` is asked before each trial and at least once a second while runs are in flight; when it says
        stop, the runs in flight are killed and recorded failed (``report.stopped``). Ctrl-C stops the same way,
        without waiting for the killed runs (``report.interrupted``). What finished is always recorded.
        """
        self.owner = new_holder()
        self.optuna.set_user_attr(HOLDER_ATTR + self.owner, True)  # the study's runs, for recover
        self.store.set_study_status(self.study_id, StudyStatus.RUNNING)
        self.recover()
        if self.guided and not self.optuna.get_trials(deepcopy=False):  # a new study: the model's best first
            for params in self.guide.warm_start():
                self.optuna.enqueue_trial(params)
        deadline = time.monotonic() + self.settings.timeout_s if self.settings.timeout_s else None
        interrupted = stopped = exhausted = False
        repeats = 0
        restore_ctrl_c = _defer_ctrl_c(ctrl_c := threading.Event())
        try:
            while not (stopped := should_stop is not None and should_stop()):
                if ctrl_c.is_set():
                    raise KeyboardInterrupt  # Ctrl-C, taken here: never between a trial started and its run held
                out_of_time = deadline is not None and time.monotonic() >= deadline
                if (
                    not out_of_time
                    and not exhausted
                    and len(self.in_flight) < dispatcher.slots
                    and (self.configs_recorded() < self.settings.trials or self._retry_waiting())
                ):
                    repeats = 0 if self._ask_one(dispatcher) else repeats + 1
                    exhausted = repeats >= REPEAT_LIMIT
                    continue
                if not self.in_flight:
                    break
                self._renew_leases()
                done, _ = wait(list(self.in_flight), timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    self._finish(future)
        except KeyboardInterrupt:
            interrupted = True
        except BaseException:  # the loop itself failed (database gone...): no run may go on behind it
            dispatcher.cancel()  # its trials stay running in the store; resuming fails them and retries (recover)
            release(self.owner)  # so they are stale from now on, to this process too
            with contextlib.suppress(Exception):  # else the next run's recover removes it
                self._drop_holder()
                self.store.set_study_status(self.study_id, StudyStatus.FAILED)
            raise
        finally:
            restore_ctrl_c()
        if stopped or interrupted:
            reason = "interrupted by the user" if interrupted else "cancelled: the study was stopped"
            self._stop_in_flight(dispatcher, reason, wait_s=0.0 if interrupted else STOP_WAIT_S)
        release(self.owner)
        self._drop_holder()
        ended = StudyStatus.INTERRUPTED if stopped or interrupted else StudyStatus.FINISHED
        self.store.set_study_status(self.study_id, ended)
        counts = self.store.study_summary(self.study_id).counts
        return StudyReport(self.study_id, interrupted, counts, stopped=stopped, exhausted=exhausted)

    def _drop_holder(self) -> None:
        """This run is over: its holder attribute goes, so a finished study keeps none."""
        self.storage.delete_study_user_attr(self.optuna._study_id, HOLDER_ATTR + self.owner)

    def _renew_leases(self) -> None:
        """Keep holding the trials in flight (every quarter lease), so a resuming process elsewhere leaves them be."""
        if time.monotonic() - self._renewed_at >= TRIAL_LEASE_S / 4:
            self._renewed_at = time.monotonic()
            ids = [entry[1] for entry in self.in_flight.values()]
            self.store.renew_trial_leases(ids, self.owner, TRIAL_LEASE_S)

    def _retry_waiting(self) -> bool:
        """A run lost with its node, actor or fork server is queued again and still waits (it is measured even at
        the budget)."""
        if self.requeued and not self.optuna.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            self.requeued.clear()  # nothing is queued any more: whatever took its place ran
        return bool(self.requeued)

    def configs_recorded(self) -> int:
        """Distinct configs the study holds so far, measured, pruned or in flight: what the budget counts."""
        return self.store.count_trials(self.study_id)

    def _ask_one(self, dispatcher: Measurer) -> bool:
        """Ask for one config and prune, dispatch or answer it; False when it repeats a recorded config."""
        if self.guided and not self.optuna.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            pick = self.guide.next_pick()
            if pick is not None:
                self.optuna.enqueue_trial(pick)
        trial = self.optuna.ask()
        trial.set_user_attr(OWNER_ATTR, self.owner)
        workload = self.settings.workload
        try:
            suggestion = self.space.suggest(trial, workload, self.settings.global_batch, self.settings.nvme_path)
        except InfeasibleConfig as infeasible:
            trial.set_constraint("memory", 1.0)
            return self._tell_infeasible(trial, infeasible.reason)
        key = suggestion.key
        self.requeued.discard(key)
        previous = self.store.find_trial_by_key(self.study_id, key)
        if previous is not None and not (previous.status == "failed" and previous.attempts <= RETRIES):
            self._tell_previous(trial, previous)
            return False
        est = estimate(workload, suggestion.trial)
        reason = capacity_reason(est, self.calibration)
        peak = est.per_gpu["total"] or 0
        constraint = peak * (1 + self.calibration.margin) / est.gpu_memory - 1
        if reason is not None:
            trial.set_constraint("memory", constraint)
            self._tell_pruned(trial, suggestion, reason, est=est)
            return True
        try:  # another process on this study may record or start the same config meanwhile: it runs there
            if previous is not None:
                trial_id = previous.id
                self.store.retry_trial(trial_id, trial.number)
            else:
                trial_id = self._record(trial, suggestion, est, "pending", constraint=constraint)
            self.store.start_trial(trial_id, owner=self.owner, lease_s=TRIAL_LEASE_S)
        except (DuplicateConfig, StoreError):
            recorded = self.store.find_trial_by_key(self.study_id, key)
            if recorded is None:
                raise
            self._tell_previous(trial, recorded)
            return False
        future = dispatcher.submit(workload, suggestion.trial, on_step=self._step_hook(workload, suggestion))
        # Optuna keeps a trial's first constraint value: it is set with the outcome, so that an OOM can say 1.0.
        self.in_flight[future] = (trial, trial_id, suggestion, est, constraint)
        self.on_event(Event(trial.number, "running"))
        return True

    def _step_hook(self, workload: Workload, suggestion: Suggestion) -> Callable[[list[float]], bool] | None:
        """The run's early-stop test (:class:`SlowRunStopper` against the best so far), or None when it is off.

        It runs on the dispatcher's thread and only reads :attr:`best_tokens_per_s`, which the loop's thread sets."""
        stopper = self.settings.early_stop
        if stopper is None:
            return None
        settings = resolve(workload, suggestion.trial)
        samples = settings.micro_batch * settings.grad_accum * workload.cluster.world_size
        tokens_per_step = float(samples * workload.train.seq_len)
        return lambda times: stopper.should_stop(times, tokens_per_step, self.best_tokens_per_s)

    def _tell_infeasible(self, trial: optuna.Trial, reason: str) -> bool:
        """Record parameters the space cannot build a config from (once per distinct set) and tell Optuna pruned;
        False when the same parameters were recorded before."""
        params = dict(trial.params)
        key = f"infeasible:{config_key(params)}"
        new = self.store.find_trial_by_key(self.study_id, key) is None
        if new:
            try:
                self.store.add_infeasible(self.study_id, trial.number, params, reason, self.hardware, config_key=key)
            except DuplicateConfig:  # another process recorded the same parameters a moment ago
                new = False
        self._tell(trial, TrialState.PRUNED)
        self.on_event(Event(trial.number, "pruned" if new else "duplicate", reason=reason))
        return new

    def _record(
        self,
        trial: optuna.Trial,
        suggestion: Suggestion,
        est: MemoryEstimate | None,
        status: str,
        reason: str | None = None,
        constraint: float | None = None,
    ) -> int:
        if constraint is None:
            constraint = dict(trial.constraints).get("memory")
        recorded = None
        if est is not None:  # the prediction with the constants fitted so far: predicted against measured
            prediction = throughput_summary(self.settings.workload, suggestion.trial, self.guide.fit)
            recorded = {**est.to_dict(), "throughput": prediction}
        try:
            return self.store.add_trial(
                self.study_id,
                trial.number,
                suggestion.key,
                suggestion.trial.ds_config,
                suggestion.params,
                suggestion.trial.activation_checkpointing,
                recorded,
                status,
                prune_reason=reason,
                constraint=constraint,
                hardware=self.hardware,
            )
        except DuplicateConfig:  # another process recorded the same config a moment ago
            if status == "pending":
                raise  # it is that process's to run
            found = self.store.find_trial_by_key(self.study_id, suggestion.key)
            assert found is not None, "the trial this config repeats is recorded"
            return found.id

    def _tell_pruned(self, trial: optuna.Trial, suggestion: Suggestion, reason: str, est: MemoryEstimate) -> None:
        self._record(trial, suggestion, est, "pruned", reason)
        self._tell(trial, TrialState.PRUNED)
        self.on_event(Event(trial.number, "pruned", reason=reason))

    def _tell_previous(self, trial: optuna.Trial, previous: Any) -> None:
        """Tell Optuna the recorded outcome of an identical config without running it again."""
        if previous.status == "oom":
            trial.set_constraint("memory", 1.0)  # as its first run was told
        elif previous.constraint is not None:
            trial.set_constraint("memory", previous.constraint)
        if previous.status == "ok":
            self._tell(trial, TrialState.COMPLETE, self._values(previous.tokens_per_s, previous.peak_bytes))
        elif previous.status == "pruned":
            self._tell(trial, TrialState.PRUNED)
        else:
            self._tell(trial, TrialState.FAIL)
        self.on_event(Event(trial.number, "duplicate", previous.tokens_per_s))

    def _values(self, tokens_per_s: float | None, peak_bytes: int | None) -> list[float]:
        values = [float(tokens_per_s or 0.0)]
        if self.settings.pareto:
            values.append(float(peak_bytes or 0))
        return values

    def _tell(self, trial: optuna.Trial, state: TrialState, values: list[float] | None = None) -> None:
        if state == TrialState.PRUNED and self.settings.pareto:
            state = TrialState.FAIL  # Optuna prunes single-objective trials only; the constraint carries the reason
        self.optuna.tell(trial, values=values, state=state)

    def _finish(self, future: Future[Measurement]) -> None:
        trial, trial_id, suggestion, est, constraint = self.in_flight.pop(future)
        try:
            measurement = future.result()
        except Exception as error:  # the dispatcher itself failed (Ray unreachable...): record, never lose it
            measurement = Measurement(status="error", exception_type=type(error).__name__, error=str(error))
        peak = max((b for b in measurement.peak_bytes_per_rank if b is not None), default=None)
        if measurement.exception_type == INFRA_LOST:  # a node, actor or fork server died: measured again
            self._requeue_lost(trial, trial_id, measurement, constraint)
            return
        self.store.finish_trial(trial_id, measurement.status, measurement.to_dict(), error=measurement.error)
        estimated_peak = est.per_gpu["total"] or 0
        if measurement.status == "ok" and measurement.stopped_early:
            self._tell_stopped_early(trial, suggestion, measurement, constraint)
            return
        if measurement.status == "ok":
            if peak:
                self.calibration = self.calibration.after_measurement(estimated_peak, peak)
                self._save_calibration()
            trial.set_constraint("memory", constraint)
            self._tell(trial, TrialState.COMPLETE, self._values(measurement.tokens_per_s, peak))
            self.guide.after_run(suggestion, (measurement.step_time_s or {}).get("p50"), measurement.tokens_per_s)
            if measurement.tokens_per_s and measurement.tokens_per_s > (self.best_tokens_per_s or 0.0):
                self.best_tokens_per_s = measurement.tokens_per_s
        else:
            if measurement.status == "oom":
                self.calibration = self.calibration.after_oom(estimated_peak, est.gpu_memory)
                self._save_calibration()
                constraint = 1.0  # infeasible, whatever the estimate said
            trial.set_constraint("memory", constraint)
            self._tell(trial, TrialState.FAIL)
        self.on_event(Event(trial.number, measurement.status, measurement.tokens_per_s, measurement.error))

    def _requeue_lost(self, trial: optuna.Trial, trial_id: int, measurement: Measurement, constraint: float) -> None:
        """A run whose node, Ray actor or fork server died (``InfraLost``): recorded ``failed`` (retryable, like a
        run a killed tuner left), told FAIL, and its config queued to run again once (:data:`RETRIES`), on whatever
        the cluster has left."""
        record = self.store.finish_trial(trial_id, "failed", measurement.to_dict(), error=measurement.error)
        trial.set_constraint("memory", constraint)
        self._tell(trial, TrialState.FAIL)
        requeued = self._queue_retry(record)
        if requeued:
            self.requeued.add(record.config_key)
        note = "queued to run again" if requeued else "not retried again"
        self.on_event(Event(trial.number, "failed", None, f"{measurement.error} ({note})"))

    def _queue_retry(self, record: TrialRecord) -> bool:
        """Queue a failed trial's config to be proposed again, while it has retries left (:data:`RETRIES`)."""
        if record.params is None or record.attempts > RETRIES:
            return False
        self.optuna.enqueue_trial(record.params, skip_if_exists=False)
        return True

    def _tell_stopped_early(
        self, trial: optuna.Trial, suggestion: Suggestion, measurement: Measurement, constraint: float
    ) -> None:
        """A run stopped for being clearly slow: each timed step's throughput reported to Optuna, then PRUNED.

        Its partial step times are real measurements, so the throughput model learns from them; its peak is not
        known (the ranks were stopped before reporting), so calibration does not."""
        tokens = measurement.tokens_per_s
        p50 = (measurement.step_time_s or {}).get("p50")
        if not self.settings.pareto and tokens and p50:  # Optuna reports intermediate values for one objective only
            tokens_per_step = tokens * p50
            for step, seconds in enumerate(measurement.ranks[0].step_times if measurement.ranks else []):
                trial.report(tokens_per_step / seconds, step)
        trial.set_constraint("memory", constraint)
        self._tell(trial, TrialState.PRUNED)
        self.guide.after_run(suggestion, p50, tokens)
        self.on_event(Event(trial.number, "stopped_early", tokens, "stopped early: clearly slower than the best"))

    def _stop_in_flight(self, dispatcher: Measurer, reason: str, wait_s: float) -> None:
        """Kill the runs in flight, wait up to ``wait_s`` for them to end, and record each failed with ``reason``;
        a run that finished before it was killed is recorded as measured."""
        dispatcher.cancel()
        if self.in_flight and wait_s > 0:
            wait(list(self.in_flight), timeout=wait_s)
        for future, (trial, trial_id, _, _, constraint) in list(self.in_flight.items()):
            if _measured_before_stop(future):
                self._finish(future)
                continue
            self.store.finish_trial(trial_id, "failed", None, error=reason)
            trial.set_constraint("memory", constraint)
            self._tell(trial, TrialState.FAIL)
        self.in_flight.clear()


def _defer_ctrl_c(flag: threading.Event) -> Callable[[], None]:
    """Until the returned function is called, Ctrl-C sets ``flag`` instead of raising KeyboardInterrupt wherever the
    main thread is (say, between a trial recorded running and its run held in flight: it would be left running); a
    second Ctrl-C raises at once. Only in the main thread over Python's own handler; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()

    def restore() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)
    return restore


def _optuna_trial_stale(trial: optuna.trial.FrozenTrial, held: set[int], others: bool) -> bool:
    """True when nobody runs this RUNNING Optuna trial any more: it was asked by a process that is gone (this host),
    or, by one elsewhere, its trial is not held in the store and it is older than a lease. A trial without an owner
    (asked before owners were recorded, or killed right after ``ask``, before its owner was written) is stale at once
    when no ``others`` (another run of the study that may be alive) could have just asked it, else once it is older
    than :data:`OWNERLESS_GRACE_S`."""
    owner = trial.user_attrs.get(OWNER_ATTR)
    started = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
    if owner is None:
        return not others or time.time() - started > OWNERLESS_GRACE_S
    alive = owner_alive(owner)
    if alive is not None:
        return not alive
    return trial.number not in held and time.time() - started > TRIAL_LEASE_S


def _measured_before_stop(future: Future[Measurement]) -> bool:
    """True when the run ended on its own (not cancelled before it started, not killed by the stop)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    return future.result().exception_type != CANCELLED
