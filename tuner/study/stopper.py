"""When the loop stops: its budget (distinct configs recorded), its timeout, a space with nothing new to offer, and,
within one run, the early stop of a run clearly slower than the best (:class:`~tuner.study.early_stop.SlowRunStopper`).
Ctrl-C is deferred to the loop's next step (:func:`defer_ctrl_c`)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from tuner.estimator import resolve
from tuner.measure.measurement import StepHook
from tuner.study.early_stop import SlowRunStopper
from tuner.workload import TrialConfig, Workload

STOP_WAIT_S = 60.0  # how long a stopped study waits for its killed runs to end before recording them
REPEAT_LIMIT = 100  # proposals in a row that repeat recorded configs before the space counts as exhausted


class Budget:
    """Whether the loop may ask for another config: before its deadline, while the space offers new configs, and
    while fewer than ``trials`` distinct configs are recorded (or a retry waits: it is run even at the budget)."""

    def __init__(self, trials: int, timeout_s: float | None) -> None:
        self.trials = trials
        self.deadline = time.monotonic() + timeout_s if timeout_s else None
        self.repeats = 0
        self.exhausted = False  # :data:`REPEAT_LIMIT` proposals in a row repeated recorded configs

    def may_ask(self, recorded: Callable[[], int], retry_waiting: Callable[[], bool]) -> bool:
        """True while another config may be asked for (``recorded`` and ``retry_waiting`` are asked lazily)."""
        out_of_time = self.deadline is not None and time.monotonic() >= self.deadline
        return not out_of_time and not self.exhausted and (recorded() < self.trials or retry_waiting())

    def proposed(self, new: bool) -> None:
        """Count a proposal: ``new`` when it was a config the study did not hold yet."""
        self.repeats = 0 if new else self.repeats + 1
        self.exhausted = self.repeats >= REPEAT_LIMIT


def step_hook(
    stopper: SlowRunStopper | None,
    workload: Workload,
    trial: TrialConfig,
    best: Callable[[], float | None],
    per_sample: float | None = None,
) -> StepHook | None:
    """The run's early-stop test (``stopper`` against ``best()``, the best tokens/s so far), or None when it is off.
    ``per_sample``: what ``best()`` counts per sample, when not the workload's tokens (``1.0``: samples/s, for a
    command whose tokens per sample are known only after a run).

    It runs on the dispatcher's thread and only reads ``best()``, which the loop's thread moves."""
    if stopper is None:
        return None
    settings = resolve(workload, trial)
    samples = settings.global_batch
    units_per_step = float(samples * (workload.train.seq_len if per_sample is None else per_sample))
    return lambda times: stopper.should_stop(times, units_per_step, best())


def defer_ctrl_c(flag: threading.Event) -> Callable[[], None]:
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


def best_stood(numbers: list[int], best: int | None) -> int:
    """How many measured trials (their ``numbers``) came after the best one (``best``: its number; None: nothing
    measured yet, so the best has stood for none).

    >>> best_stood([0, 1, 2, 3], 1), best_stood([0, 1], 1), best_stood([], None)
    (2, 0, 0)
    """
    return 0 if best is None else sum(number > best for number in numbers)
