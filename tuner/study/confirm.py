"""The winner confirmed by an independent run: after a study, its best config is run once more, a fresh run of the
same workload (for a script study: the same command under the same launcher), and what that run measured is
recorded beside the trial as its ``confirmation`` (its throughput and the ratio to the trial's), so that ``best`` and
the study's report can say whether the trial's figure holds up in a run the search did not pick it from.

Pure logic over the small :class:`~tuner.study.measurer.Measurer` interface and the store; the CLI decides when to
confirm (``dstune tune --confirm``, on by default for a training command's study).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.measure.measurement import Measurement
    from tuner.storage import Store, TrialRecord
    from tuner.study.measurer import Measurer
    from tuner.workload import Workload

CONFIRMATION = "confirmation"  # the key of the trial's measurement that holds it
CONFIRMED_WITHIN = 0.9  # a confirmation at least this fraction of the trial's throughput holds it up


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

    @property
    def ratio(self) -> float | None:
        """The confirmation's throughput over the trial's (None when it measured none)."""
        if self.tokens_per_s is None or not self.trial_tokens_per_s:
            return None
        return self.tokens_per_s / self.trial_tokens_per_s

    @property
    def holds(self) -> bool:
        """True when the run succeeded at no less than :data:`CONFIRMED_WITHIN` of the trial's throughput."""
        return self.status == "ok" and self.ratio is not None and self.ratio >= CONFIRMED_WITHIN

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
        """
        if self.status != "ok" or self.ratio is None:
            why = f": {self.error}" if self.error else ""
            return f"not confirmed: the independent run ended {self.status}{why}"
        figures = f"{self.tokens_per_s:,.0f} tokens/s, {self.ratio:.2f}× the trial's {self.trial_tokens_per_s:,.0f}"
        if self.holds:
            return f"confirmed by an independent run: {figures}"
        return f"not confirmed: an independent run measured {figures} (below {CONFIRMED_WITHIN:.2f}×)"


def recorded_confirmation(trial: TrialRecord) -> Confirmation | None:
    """The confirmation stored beside ``trial``, if any."""
    data = (trial.measurement or {}).get(CONFIRMATION)
    return Confirmation.from_dict(data) if isinstance(data, dict) else None


def confirmation_of(trial: TrialRecord, measured: Measurement, wall_s: float) -> Confirmation:
    """What the independent run ``measured`` says of ``trial``."""
    peaks = [peak for peak in measured.peak_bytes_per_rank if peak is not None]
    ok = measured.status == "ok"
    return Confirmation(
        trial_number=trial.number,
        status=measured.status,
        tokens_per_s=measured.tokens_per_s if ok else None,
        trial_tokens_per_s=float(trial.tokens_per_s or 0.0),
        error=None if ok else _last_line(measured.error),
        step_time_p50_s=(measured.step_time_s or {}).get("p50") if ok else None,
        peak_bytes=max(peaks) if peaks else None,
        wall_s=measured.timings.get("wall_s", wall_s),
    )


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
