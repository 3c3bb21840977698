"""The rule of a winner's confirmation run (:mod:`tuner.study.confirm`), pure: how many timed steps it runs, chosen
from the trial's own step times, and its verdict, from the medians of the two runs' step times.

A trial times a few steps (``--steps``, 3 by default): on a loaded host, a mean or even a median of 3 short steps
moves by tens of percent from run to run, so a confirmation of as many steps confirms nothing. The confirmation runs
enough steps for :data:`CONFIRM_TIMED_S` seconds of timed work (at least :data:`CONFIRM_MIN_STEPS` and twice the
trial's, at most :data:`CONFIRM_MAX_STEPS`), never past :data:`CONFIRM_MAX_TIMED_S` seconds of timed work (but always
more steps than the trial), and compares the median step times: one slow step (a collection, a neighbour's burst)
moves neither median.

Example:
    >>> confirmation_steps([0.07, 0.07, 0.08], 3)  # 5 s of 0.07 s steps
    72
    >>> confirmation_steps([2.0, 2.1, 2.0], 3)  # slow steps: the floor of 10
    10
    >>> confirmation_steps([30.0, 31.0, 30.0], 3)  # never past 60 s of timed work, yet more steps than the trial's
    4
    >>> speed_ratio([0.10, 0.10, 0.50], [0.11, 0.10, 0.10, 0.12, 0.10])  # the trial's median over the run's
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import median
from typing import Any

CONFIRM_TIMED_S = 5.0  # the timed work a confirmation aims at, in seconds of the trial's median step
CONFIRM_MIN_STEPS = 10  # and at least this many timed steps (and twice the trial's)
CONFIRM_MAX_STEPS = 200  # and at most this many
CONFIRM_MAX_TIMED_S = 60.0  # nor more timed work than this, in seconds of the trial's median step
CONFIRMED_WITHIN = 0.9  # the confirmation's speed at least this fraction of the trial's holds it up


def confirmation_steps(trial_step_times: Sequence[float], trial_steps: int) -> int:
    """The timed steps of the confirmation of a trial that timed ``trial_step_times`` (``trial_steps`` of them
    asked): :data:`CONFIRM_TIMED_S` of its median step, bounded as the module says. Without step times (a run
    that recorded none), the floor."""
    floor = max(CONFIRM_MIN_STEPS, 2 * trial_steps)
    typical = median(trial_step_times) if trial_step_times else 0.0
    if typical <= 0:
        return floor
    steps = min(max(floor, math.ceil(CONFIRM_TIMED_S / typical)), CONFIRM_MAX_STEPS)
    return max(trial_steps + 1, min(steps, math.floor(CONFIRM_MAX_TIMED_S / typical)))


def speed_ratio(trial_step_times: Sequence[float], confirm_step_times: Sequence[float]) -> float | None:
    """The confirmation's speed over the trial's: the trial's median step time over the confirmation's (the same
    config, so the same samples per step); None when either run timed no step."""
    if not trial_step_times or not confirm_step_times:
        return None
    confirm = median(confirm_step_times)
    return median(trial_step_times) / confirm if confirm > 0 else None


def holds(ratio: float | None) -> bool:
    """Whether a confirmation at ``ratio`` of the trial's speed holds the trial's figure up: at least
    :data:`CONFIRMED_WITHIN` (a faster confirmation holds it too: the trial's figure did not overstate the config)."""
    return ratio is not None and ratio >= CONFIRMED_WITHIN


def run_step_times(ranks: Iterable[Sequence[float]]) -> list[float]:
    """A run's step times from its ranks': a step takes as long as its slowest rank (as the run's own figures)."""
    per_rank = [list(times) for times in ranks]
    steps = min((len(times) for times in per_rank), default=0)
    return [max(times[step] for times in per_rank) for step in range(steps)]


def recorded_step_times(measurement: dict[str, Any] | None) -> list[float]:
    """The step times a stored measurement's ranks timed (none when it kept no ranks)."""
    ranks = (measurement or {}).get("ranks") or []
    return run_step_times(rank.get("step_times") or [] for rank in ranks if isinstance(rank, dict))
