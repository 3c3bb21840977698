"""The winner confirmed by an independent run: after a study, its best config is run once more, a fresh run of the
same workload (for a script study: the same command under the same launcher), and what that run measured is
recorded beside the trial as its ``confirmation`` (its throughput and the ratio to the trial's), so that ``best`` and
the study's report can say whether the trial's figure holds up in a run the search did not pick it from. The
confirmation times more steps than the trial, chosen from the trial's own step time, and compares the medians of the
two runs' step times (:mod:`tuner.study.confirm_rule`).

Pure logic over the small :class:`~tuner.study.measurer.Measurer` interface and the store; the CLI decides when to
confirm (``dstune tune --confirm``, on by default for a training command's study).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from statistics import median
from typing import TYPE_CHECKING, Any

from tuner.study.confirm_rule import (
    CONFIRMED_WITHIN,
    confirmation_steps,
    holds,
    recorded_step_times,
    run_step_times,
    speed_ratio,
)

if TYPE_CHECKING:
    from tuner.measure.measurement import Measurement
    from tuner.measure.options import MeasureOptions
    from tuner.storage import Store, TrialRecord
    from tuner.study.measurer import Measurer
    from tuner.workload import Workload

CONFIRMATION = "confirmation"  # the key of the trial's measurement that holds it


@dataclass(frozen=True)
class Confirmation:
    """What the independent run of a trial's config measured, beside the trial's own figure."""

    trial_number: int
    status: str
    tokens_per_s: float | None
    trial_tokens_per_s: float
    error: str | None = None
    step_time_p50_s: float | None = None
    peak_bytes: int | None = None
    wall_s: float | None = None
    # the speed ratio from the medians of the two runs' step times (confirm_rule.speed_ratio), and their step counts
    step_ratio: float | None = None
    steps: int | None = None
    trial_steps: int | None = None
    trial_step_time_p50_s: float | None = None

    @property
    def ratio(self) -> float | None:
        """The confirmation's speed over the trial's: from the medians of their step times; a confirmation recorded
        without them, its throughput over the trial's (None when it measured none)."""
        if self.status != "ok":
            return None
        if self.step_ratio is not None:
            return self.step_ratio
        if self.tokens_per_s is None or not self.trial_tokens_per_s:
            return None
        return self.tokens_per_s / self.trial_tokens_per_s

    @property
    def holds(self) -> bool:
        """True when the run succeeded at no less than :data:`CONFIRMED_WITHIN` of the trial's speed."""
        return self.status == "ok" and holds(self.ratio)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as stored under the trial's measurement (``ratio`` included)."""
        return {
            "trial_number": self.trial_number,
            "status": self.status,
            "tokens_per_s": self.tokens_per_s,
            "trial_tokens_per_s": self.trial_tokens_per_s,
            "ratio": self.ratio,
            "error": self.error,
            "step_time_p50_s": self.step_time_p50_s,
            "peak_bytes": self.peak_bytes,
            "wall_s": self.wall_s,
            "step_ratio": self.step_ratio,
            "steps": self.steps,
            "trial_steps": self.trial_steps,
            "trial_step_time_p50_s": self.trial_step_time_p50_s,
            "holds": self.holds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        """The inverse of :meth:`to_dict` (``ratio`` is derived again)."""
        names = cls.__dataclass_fields__
        return cls(**{key: value for key, value in data.items() if key in names})

    def line(self) -> str:
        """One line for ``best`` and the report.

        >>> Confirmation(4, "ok", 9_500.0, 10_000.0).line()
        "confirmed by an independent run: 9,500 tokens/s, 0.95× the trial's 10,000"
        >>> Confirmation(4, "ok", 7_000.0, 10_000.0).line()
        "not confirmed: an independent run measured 7,000 tokens/s, 0.70× the trial's 10,000 (below 0.90×)"
        >>> Confirmation(4, "oom", None, 10_000.0, error="CUDA out of memory").line()
        'not confirmed: the independent run ended oom: CUDA out of memory'
        >>> Confirmation(4, "ok", None, 0.0, step_time_p50_s=0.2, step_ratio=0.5, steps=25, trial_steps=3,
        ...              trial_step_time_p50_s=0.1).line()
        "not confirmed: an independent run measured 0.50× the trial's speed (median step 0.2 s over 25 timed steps; \
the trial's 0.1 s over 3) (below 0.90×)"
        """
        if self.status != "ok" or self.ratio is None:
            why = f": {self.error}" if self.error else ""
            return f"not confirmed: the independent run ended {self.status}{why}"
        if self.tokens_per_s is not None and self.trial_tokens_per_s:
            figures = f"{self.tokens_per_s:,.0f} tokens/s, {self.ratio:.2f}× the trial's {self.trial_tokens_per_s:,.0f}"
        else:
            figures = f"{self.ratio:.2f}× the trial's speed"
        if self.step_ratio is not None and self.step_time_p50_s is not None and self.trial_step_time_p50_s is not None:
            figures += (
                f" (median step {self.step_time_p50_s:.3g} s over {self.steps} timed steps; "
                f"the trial's {self.trial_step_time_p50_s:.3g} s over {self.trial_steps})"
            )
        if self.holds:
            return f"confirmed by an independent run: {figures}"
        return f"not confirmed: an independent run measured {figures} (below {CONFIRMED_WITHIN:.2f}×)"


def recorded_confirmation(trial: TrialRecord) -> Confirmation | None:
    """The confirmation stored beside ``trial``, if any."""
    data = (trial.measurement or {}).get(CONFIRMATION)
    return Confirmation.from_dict(data) if isinstance(data, dict) else None


def confirmation_of(trial: TrialRecord, measured: Measurement, wall_s: float) -> Confirmation:
    """What the independent run ``measured`` says of ``trial``: the speed ratio from the medians of the two runs'
    step times (:func:`~tuner.study.confirm_rule.speed_ratio`)."""
    peaks = [peak for peak in measured.peak_bytes_per_rank if peak is not None]
    ok = measured.status == "ok"
    trial_times = _trial_step_times(trial)
    times = run_step_times(rank.step_times for rank in measured.ranks) if ok else []
    return Confirmation(
        trial_number=trial.number,
        status=measured.status,
        tokens_per_s=measured.tokens_per_s if ok else None,
        trial_tokens_per_s=float(trial.tokens_per_s or 0.0),
        error=None if ok else _last_line(measured.error),
        step_time_p50_s=(median(times) if times else (measured.step_time_s or {}).get("p50")) if ok else None,
        peak_bytes=max(peaks) if peaks else None,
        wall_s=measured.timings.get("wall_s", wall_s),
        step_ratio=speed_ratio(trial_times, times),
        steps=len(times) if times else None,
        trial_steps=len(trial_times) if trial_times else None,
        trial_step_time_p50_s=median(trial_times) if trial_times else None,
    )


def confirmation_options(trial: TrialRecord, options: MeasureOptions) -> MeasureOptions:
    """How the confirmation of ``trial`` is measured: the study's own options with more timed steps, chosen from
    the trial's step time (:func:`~tuner.study.confirm_rule.confirmation_steps`); a training command that ends by
    itself before them is measured on the steps it timed, as long as they are no fewer than the trial's."""
    times = _trial_step_times(trial)
    trial_steps = len(recorded_step_times(trial.measurement)) or options.steps
    return replace(options, steps=confirmation_steps(times, trial_steps), steps_at_least=trial_steps)


def _trial_step_times(trial: TrialRecord) -> list[float]:
    """The trial's step times (its ranks'), else its median step time alone (a record that kept no ranks)."""
    times = recorded_step_times(trial.measurement)
    p50 = ((trial.measurement or {}).get("step_time_s") or {}).get("p50")
    return times or ([float(p50)] if p50 else [])


def confirm_best(store: Store, study_id: int, workload: Workload, measurer: Measurer) -> Confirmation | None:
    """Run the study's best config once more through ``measurer`` (never stopped early) and record what it measured
    beside the trial; a best already confirmed keeps its confirmation. None when nothing was measured."""
    best = store.best_trial(study_id)
    if best is None:
        return None
    done = recorded_confirmation(best)
    if done is not None:
        return done
    started = time.monotonic()
    future = measurer.submit(workload, best.trial)
    try:
        measured = future.result()
    except Exception as error:  # the dispatcher itself failed: said as the confirmation's outcome, never raised
        from tuner.measure.measurement import Measurement

        measured = Measurement(status="error", exception_type=type(error).__name__, error=str(error))
    confirmation = confirmation_of(best, measured, time.monotonic() - started)
    store.record_confirmation(best.id, confirmation.to_dict())
    return confirmation


def _last_line(text: str | None) -> str | None:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else None
