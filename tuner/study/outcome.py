"""Recording and telling: every trial's outcome lands in the store and is told to Optuna, and the study learns from
it (the calibrated memory margin, the throughput fit, the best tokens/s so far).

Pruned configs are told PRUNED with a positive memory constraint (the sampler learns the infeasible region); an
out-of-memory failure says 1.0 whatever the estimate said; a proposal that repeats a recorded config is told that
config's outcome; a run stopped early for being clearly slow reports each step's throughput and is told PRUNED; a
run whose step-0 numerics left its reference's (:mod:`tuner.study.numerics_guard`) is recorded ``diverged`` with both
figures and told FAIL (never recommended: the recommender takes ``ok`` runs only); a run that trained but whose
measured peak exceeds the GPU memory the study targets (``--gpu-memory``: CPU ranks have no such wall, nor does a
larger GPU than the target) is recorded ``oom`` with both figures, its measurement kept, and told FAIL with the
constraint 1.0, as a run that ran out of memory on a GPU of that size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner.estimator import MemoryEstimate
from tuner.forecast import Calibration, ThroughputGuide, allocated_part, throughput_summary
from tuner.measure.measurement import INFRA_LOST, Measurement
from tuner.space import Suggestion, config_key
from tuner.storage import DuplicateConfig, Store, TrialRecord
from tuner.study.numerics_guard import NumericsGuard
from tuner.study.proposer import Proposer
from tuner.study.settings import Event, StudySettings
from tuner.units import format_bytes

DUPLICATE_ATTR = "dstune_duplicate_of"  # Optuna user attribute of a proposal answered from a record: its trial number
REASON_ATTR = "dstune_reason"  # Optuna user attribute: why a trial was told PRUNED without a run of its own
IN_FLIGHT = ("pending", "running")  # a recorded config another process is measuring


@dataclass(frozen=True)
class Run:
    """A run in flight: its Optuna trial, its record's id, its config, estimate and memory constraint (told with the
    outcome: Optuna keeps a trial's first constraint value, so that an OOM can say 1.0)."""

    trial: optuna.Trial
    trial_id: int
    suggestion: Suggestion
    estimate: MemoryEstimate | None  # None: the model is unknown (a training command without --model)
    constraint: float


def load_calibration(store: Store, hardware: str, family: str) -> Calibration:
    """The calibration stored for (hardware, model family), or a fresh one."""
    found = store.get_calibration(hardware, family)
    if found is None:
        return Calibration()
    stats = found.stats or {}
    return Calibration(margin=found.margin, ratios=tuple(stats.get("ratios", ())), ooms=int(stats.get("ooms", 0)))


class Recorder:
    """Records outcomes in the store, tells them to Optuna, and keeps what the study learns from them."""

    def __init__(
        self,
        settings: StudySettings,
        store: Store,
        study_id: int,
        study: optuna.Study,
        guide: ThroughputGuide,
        calibration: Calibration,
        proposer: Proposer,
        emit: Callable[[Event], None],
    ) -> None:
        self.settings, self.store, self.study_id, self.study = settings, store, study_id, study
        self.guide, self.proposer, self.emit = guide, proposer, emit
        self.hardware = settings.workload.cluster.hardware_key
        self.family = settings.workload.model.family
        self.calibration = calibration
        self.guard = NumericsGuard(settings.workload.cluster.world_size)
        for record in store.trials(study_id, status="ok"):  # a resumed study: the references measured before
            self.guard.learn(record.number, record.trial, (record.measurement or {}).get("numerics") or {})
        best = store.best_trial(study_id)  # what a run must not be clearly slower than (early stop)
        self.best_tokens_per_s: float | None = best.tokens_per_s if best is not None else None
        # the best's samples/s: what a run of a command whose tokens per sample are unknown before it is judged by
        self.best_samples_per_s: float | None = (best.measurement or {}).get("samples_per_s") if best else None

    # ----------------------------------------------------------------- before a run
    def record(
        self,
        trial: optuna.Trial,
        suggestion: Suggestion,
        est: MemoryEstimate | None,
        status: str,
        reason: str | None = None,
        constraint: float | None = None,
    ) -> int:
        """Record a config (with its estimate and the throughput predicted for it); the id of its record. A config
        another process recorded a moment ago gives that record's id, unless this one was to run it (``pending``:
        :class:`DuplicateConfig`)."""
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

    def tell_infeasible(self, trial: optuna.Trial, reason: str) -> bool:
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
        self.tell(trial, TrialState.PRUNED)
        self.emit(Event(trial.number, "pruned" if new else "duplicate", reason=reason))
        return new

    def tell_pruned(self, trial: optuna.Trial, suggestion: Suggestion, reason: str, est: MemoryEstimate | None) -> None:
        """A config the estimator says cannot fit: recorded pruned with its reason, told PRUNED, never run."""
        self.record(trial, suggestion, est, "pruned", reason)
        self.tell(trial, TrialState.PRUNED)
        self.emit(Event(trial.number, "pruned", reason=reason, config=suggestion.trial.summary()))

    def tell_previous(self, trial: optuna.Trial, previous: TrialRecord) -> None:
        """Tell Optuna the recorded outcome of an identical config without running it again. A config another
        process is measuring has no outcome yet: it is told PRUNED (not run here), with the trial it repeats and why,
        never FAIL (Optuna's own views would show a failure for a config measured ok)."""
        trial.set_user_attr(DUPLICATE_ATTR, previous.number)
        if previous.status == "oom":
            trial.set_constraint("memory", 1.0)  # as its first run was told
        elif previous.constraint is not None:
            trial.set_constraint("memory", previous.constraint)
        if previous.status == "ok":
            self.tell(trial, TrialState.COMPLETE, self.values(previous.tokens_per_s, previous.peak_bytes))
        elif previous.status == "pruned":
            self.tell(trial, TrialState.PRUNED)
        elif previous.status in IN_FLIGHT:
            trial.set_user_attr(REASON_ATTR, f"measured by another process (trial {previous.number})")
            self.tell(trial, TrialState.PRUNED)
        else:
            self.tell(trial, TrialState.FAIL)
        self.emit(Event(trial.number, "duplicate", previous.tokens_per_s, config=previous.trial.summary()))

    def _host_share(self, run: Run) -> int:
        """On CPU ranks, the bytes of a rank's measured peak that a GPU would not hold: its share of the states
        offloaded to the node's CPU, which CPU ranks keep in the same memory (0 on CUDA, where the device's
        allocator counts the device only)."""
        cluster = self.settings.workload.cluster
        if run.estimate is None or cluster.device != "cpu":
            return 0
        return run.estimate.host_states_per_rank(cluster.gpus_per_node)

    def _memory(self, run: Run) -> int:
        """A rank's memory: the estimate's, else the cluster's (``--gpu-memory``)."""
        return run.estimate.gpu_memory if run.estimate is not None else self.settings.workload.cluster.gpu_memory

    def _estimated_peak(self, run: Run, host: int) -> int | None:
        """What the estimate says the measured peak counts (on CUDA max_memory_allocated: the estimate's allocated
        part only), None without an estimate (nothing to calibrate from)."""
        if run.estimate is None:
            return None
        return allocated_part(run.estimate.gpu_total, run.estimate.overhead_terms) + host

    def _learn_peak(self, estimated_peak: int | None, peak: int | None) -> None:
        """Move the margin from a measured peak against its estimate (neither missing)."""
        if peak and estimated_peak is not None:
            self.calibration = self.calibration.after_measurement(estimated_peak, peak)
            self._save_calibration()

    def values(self, tokens_per_s: float | None, peak_bytes: int | None) -> list[float]:
        """The objective values: tokens/s, and the peak bytes for a Pareto study."""
        values = [float(tokens_per_s or 0.0)]
        if self.settings.pareto:
            values.append(float(peak_bytes or 0))
        return values

    def tell(self, trial: optuna.Trial, state: TrialState, values: list[float] | None = None) -> None:
        """Finish the Optuna trial."""
        if state == TrialState.PRUNED and self.settings.pareto:
            state = TrialState.FAIL  # Optuna prunes single-objective trials only; the constraint carries the reason
        self.study.tell(trial, values=values, state=state)

    # ----------------------------------------------------------------- after a run
    def finish(self, run: Run, measurement: Measurement) -> None:
        """Record a run's measurement, tell it, and learn from it."""
        trial, constraint = run.trial, run.constraint
        peak = max((b for b in measurement.peak_bytes_per_rank if b is not None), default=None)
        if measurement.exception_type == INFRA_LOST:  # a node, actor or fork server died: measured again
            self._requeue_lost(run, measurement)
            return
        diverged = over_budget = None
        host = self._host_share(run)
        if measurement.status == "ok" and not measurement.stopped_early:
            diverged = self.guard.judge(trial.number, run.suggestion.trial, measurement.numerics)
            over_budget = measured_over(peak, self._memory(run), host)
        rejected = diverged or over_budget
        status = "diverged" if diverged else "oom" if over_budget else measurement.status
        self.store.finish_trial(run.trial_id, status, measurement.to_dict(), error=rejected or measurement.error)
        estimated_peak = self._estimated_peak(run, host)
        if measurement.status == "ok" and measurement.stopped_early:
            self._tell_stopped_early(run, measurement)
            return
        if rejected:  # its bytes and seconds are real, its training is not usable: calibrated from, told FAIL
            self._learn_peak(estimated_peak, peak)
            trial.set_constraint("memory", 1.0 if over_budget and not diverged else constraint)
            self.tell(trial, TrialState.FAIL)
            summary = run.suggestion.trial.summary()
            self.emit(Event(trial.number, status, measurement.tokens_per_s, rejected, summary, peak))
            return
        if measurement.status == "ok":
            self._learn_peak(estimated_peak, peak)
            trial.set_constraint("memory", constraint)
            self.tell(trial, TrialState.COMPLETE, self.values(measurement.tokens_per_s, peak))
            p50 = (measurement.step_time_s or {}).get("p50")
            self.guide.after_run(run.suggestion, p50, measurement.tokens_per_s)
            if measurement.tokens_per_s and measurement.tokens_per_s > (self.best_tokens_per_s or 0.0):
                self.best_tokens_per_s = measurement.tokens_per_s
                self.best_samples_per_s = measurement.samples_per_s
        else:
            if measurement.status == "oom" and estimated_peak is not None:
                self.calibration = self.calibration.after_oom(estimated_peak, self._memory(run))
                self._save_calibration()
            if measurement.status == "oom":
                constraint = 1.0  # infeasible, whatever the estimate said
            trial.set_constraint("memory", constraint)
            self.tell(trial, TrialState.FAIL)
        summary = run.suggestion.trial.summary()
        self.emit(Event(trial.number, measurement.status, measurement.tokens_per_s, measurement.error, summary, peak))

    def fail(self, run: Run, reason: str) -> None:
        """A run killed before it ended: recorded failed with ``reason`` and told FAIL."""
        self.store.finish_trial(run.trial_id, "failed", None, error=reason)
        run.trial.set_constraint("memory", run.constraint)
        self.tell(run.trial, TrialState.FAIL)

    def _requeue_lost(self, run: Run, measurement: Measurement) -> None:
        """A run whose node, Ray actor or fork server died (``InfraLost``): recorded ``failed`` (retryable, like a
        run a killed tuner left), told FAIL, and its config queued to run again once
        (:data:`~tuner.study.proposer.RETRIES`), on whatever the cluster has left."""
        record = self.store.finish_trial(run.trial_id, "failed", measurement.to_dict(), error=measurement.error)
        run.trial.set_constraint("memory", run.constraint)
        self.tell(run.trial, TrialState.FAIL)
        note = "queued to run again" if self.proposer.queue_retry(record) else "not retried again"
        self.emit(
            Event(run.trial.number, "failed", None, f"{measurement.error} ({note})", run.suggestion.trial.summary())
        )

    def _tell_stopped_early(self, run: Run, measurement: Measurement) -> None:
        """A run stopped for being clearly slow: each timed step's throughput reported to Optuna, then PRUNED.

        Its partial step times are real measurements, so the throughput model learns from them; its peak is not
        known (the ranks were stopped before reporting), so calibration does not."""
        trial = run.trial
        tokens = measurement.tokens_per_s
        p50 = (measurement.step_time_s or {}).get("p50")
        if not self.settings.pareto and tokens and p50:  # Optuna reports intermediate values for one objective only
            tokens_per_step = tokens * p50
            for step, seconds in enumerate(measurement.ranks[0].step_times if measurement.ranks else []):
                trial.report(tokens_per_step / seconds, step)
        trial.set_constraint("memory", run.constraint)
        self.tell(trial, TrialState.PRUNED)
        self.guide.after_run(run.suggestion, p50, tokens)
        self.emit(
            Event(trial.number, "stopped_early", tokens, "clearly slower than the best", run.suggestion.trial.summary())
        )

    def _save_calibration(self) -> None:
        self.guide.recalibrate(self.calibration)  # its picks from now on fit with the margin learned
        cal = self.calibration
        self.store.put_calibration(
            self.hardware, self.family, cal.margin, len(cal.ratios), {"ratios": list(cal.ratios), "ooms": cal.ooms}
        )


def measured_over(peak: int | None, gpu_memory: int, host: int = 0, whose: str = "the study targets") -> str | None:
    """Why a run that trained does not fit the GPU memory the study targets, or None when it does. ``host``: the
    bytes of the measured peak that a GPU would not hold (on CPU ranks, the states offloaded to the node's CPU)."""
    if peak is None or peak - host <= gpu_memory:
        return None
    offloaded = f" beside the {format_bytes(host)} it offloads to the CPU" if host else ""
    over = peak - host - gpu_memory
    by = format_bytes(over) if over >= 2**20 // 10 else f"{over:,} B"  # in the units of the rest of the line
    return (
        f"measured peak {format_bytes(peak - host)} per GPU{offloaded} exceeds the {format_bytes(gpu_memory)} "
        f"{whose} (--gpu-memory) by {by}: a GPU of that size runs out of memory"
    )
