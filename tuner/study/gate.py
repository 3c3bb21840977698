"""The gate between a proposal and a run: is it a config the study already holds (answered from its record), and
does it fit (the estimator with the calibrated safety margin; one that cannot is pruned without a run)."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimator import MemoryEstimate, estimate
from tuner.forecast import Calibration, memory_reason
from tuner.storage import TrialRecord
from tuner.study.proposer import RETRIES
from tuner.workload import TrialConfig, Workload


def capacity_reason(est: MemoryEstimate, calibration: Calibration) -> str | None:
    """Why the estimate (with the margin) does not fit, as a sentence for people (:mod:`tuner.forecast`), or
    None when it fits."""
    reason = memory_reason(est, calibration)
    return None if reason is None else reason.sentence()


@dataclass(frozen=True)
class Verdict:
    """The estimator's judgement of one config."""

    estimate: MemoryEstimate | None  # None: the model is unknown (a training command without --model)
    reason: str | None  # why it cannot fit (it is pruned), or None: it is measured
    constraint: float  # Optuna's memory constraint: peak with the margin over the memory, minus 1 (≤ 0 fits)


def judge(workload: Workload, trial: TrialConfig, calibration: Calibration) -> Verdict:
    """Estimate ``trial`` and decide whether it can fit, with the calibrated margin; a model dstune does not know
    (:attr:`~tuner.workload.ModelSpec.is_unknown`) is not estimated: every config runs, unless the runs rule it out
    (:mod:`tuner.study.memory_bound`)."""
    if workload.model.is_unknown:
        return Verdict(None, None, 0.0)
    est = estimate(workload, trial)
    peak = est.per_gpu["total"] or 0
    constraint = peak * (1 + calibration.margin) / est.gpu_memory - 1
    return Verdict(est, capacity_reason(est, calibration), constraint)


def answered_by_record(previous: TrialRecord) -> bool:
    """True when a proposal of ``previous``'s config (one the study recorded) is answered with its outcome instead
    of a run; False when it is to run again: failed with a retry left (:data:`~tuner.study.proposer.RETRIES`)."""
    return not (previous.status == "failed" and previous.attempts <= RETRIES)
