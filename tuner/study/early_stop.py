"""Stop a measured run early when it is clearly slower than the best run so far.

A run reports each timed step's seconds while it goes on (``Measurer.submit(..., on_step=...)``). The rule: once at
least ``min_steps`` timed steps finished, a run whose median throughput is below ``fraction`` of the best measured
throughput of the study is stopped. It is recorded ``ok`` with ``measurement["stopped_early"] = true`` and its partial
figures, told to Optuna as PRUNED after each step's throughput was reported (``trial.report``); memory pruning stays
the estimator's (status ``pruned``, with a reason, never run).

Why this rule rather than Optuna's own pruners: a measured run has only a few timed steps (3 by default) and every
step measures the same quantity, so Optuna's step-wise comparisons (Median/PercentilePruner compare a trial with others
*at the same step* and need several completed trials first) add nothing but start-up delay, and the Hyperband family
is built for learning curves. Comparing the running median with the best so far is Optuna's ThresholdPruner with a
moving threshold. The median over at least two steps ignores one step slowed by something else on the host, and the
default fraction 0.5 keeps a 2× margin: a loaded host moves step times by tens of percent, not by half, so a stopped
run could not have become the best.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class SlowRunStopper:
    """Stop a run whose median throughput is below ``fraction`` × the best, after ``min_steps`` timed steps.

    >>> stopper = SlowRunStopper(fraction=0.5, min_steps=2)
    >>> stopper.should_stop([1.0], tokens_per_step=100.0, best_tokens_per_s=1000.0)  # too early to judge
    False
    >>> stopper.should_stop([1.0, 0.9], tokens_per_step=100.0, best_tokens_per_s=1000.0)  # ~105 tokens/s < 500
    True
    >>> stopper.should_stop([0.15, 0.9], tokens_per_step=100.0, best_tokens_per_s=300.0)  # ~190 tokens/s ≥ 150
    False
    >>> stopper.should_stop([1.0, 0.9], tokens_per_step=100.0, best_tokens_per_s=None)  # nothing measured yet
    False
    """

    fraction: float = 0.5
    min_steps: int = 2

    def should_stop(self, step_times: list[float], tokens_per_step: float, best_tokens_per_s: float | None) -> bool:
        """True when the run so far is clearly slower than the best (see the module docstring)."""
        if not best_tokens_per_s or len(step_times) < self.min_steps or tokens_per_step <= 0:
            return False
        typical = median(step_times)
        return typical > 0 and tokens_per_step / typical < self.fraction * best_tokens_per_s
