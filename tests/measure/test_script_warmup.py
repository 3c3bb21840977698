"""A training command's warm-up as the rank hook counts it (tuner.measure.script.rank_hook), fast: its step
bookkeeping driven by hand in this process, one rank, no DeepSpeed (the real runs are in test_script_runs.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tuner.measure.script import rank_hook


def warm_up(tmp_path: Path, warmup_max: int | None, step_times: list[float]) -> rank_hook._State:
    """The hook's state after optimizer steps of ``step_times`` seconds (never reaching its timed steps' end)."""
    (tmp_path / rank_hook.HOOK_FILE).write_text(json.dumps({"warmup": 2, "steps": 50, "warmup_max": warmup_max}))
    state = rank_hook._State(tmp_path)
    state.rank = 0
    previous, rank_hook._state = rank_hook._state, state
    try:
        for seconds in step_times:
            state.last_step_end = time.monotonic() - seconds
            rank_hook._stepped()
    finally:
        rank_hook._state = previous
    return state


STEPS = [3.0, 1.5, 1.0, 1.02, 1.01, 1.0]  # settled once two agree within 10 %: after the fourth


def test_with_warmup_max_the_warm_up_goes_on_until_the_step_times_settle(tmp_path: Path) -> None:
    state = warm_up(tmp_path, 5, STEPS)
    assert state.times["warmup_done"] == 4 and state.phase == "timed steps"
    assert [round(t, 1) for t in state.step_times] == [1.0, 1.0]


def test_the_warm_up_stops_at_warmup_max_even_unsettled(tmp_path: Path) -> None:
    state = warm_up(tmp_path, 3, [3.0, 2.0, 1.0, 0.5])
    assert state.times["warmup_done"] == 3 and len(state.step_times) == 1


def test_without_warmup_max_exactly_warmup_steps(tmp_path: Path) -> None:
    state = warm_up(tmp_path, None, STEPS)
    assert state.times["warmup_done"] == 2 and len(state.step_times) == 4
