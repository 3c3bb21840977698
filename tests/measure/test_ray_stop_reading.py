"""How the Ray driver reads a rank that failed after timed steps with no stop heard of (tuner.measure.driver.
ray_launcher._reading): the driver, which knows whether and when it decided a stop, picks the reading, instead of the
rank waiting a fixed time for a notice that a loaded node may deliver later."""

from __future__ import annotations

from dataclasses import asdict

from tuner.measure.driver.ray_launcher import _reading
from tuner.measure.measurement import RankResult

BROKEN = asdict(RankResult(1, "error", exception_type="DistBackendError", error="Connection closed by peer"))
STOPPED = asdict(RankResult(1, "ok", exception_type="StoppedEarly", error="stopped early", step_times=[0.5, 0.5]))


def test_a_failure_written_after_the_drivers_stop_reads_as_stopped_early() -> None:
    answer = {"result": BROKEN, "if_stopped": STOPPED, "ended_at": 1000.2}
    assert _reading(answer, decided_at=1000.0).status == "ok"
    assert _reading({**answer, "ended_at": None}, decided_at=1000.0).status == "ok"  # no report written: killed


def test_a_failure_before_the_stop_or_without_one_stays_the_configs() -> None:
    answer = {"result": BROKEN, "if_stopped": STOPPED, "ended_at": 999.0}
    assert _reading(answer, decided_at=1000.0).status == "error"
    assert _reading({**answer, "ended_at": 1001.0}, decided_at=None).status == "error"
    assert _reading({"result": STOPPED, "if_stopped": None, "ended_at": 1001.0}, decided_at=1000.0).status == "ok"
