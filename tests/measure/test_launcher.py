"""How the local launcher classifies a rank from its report and from why it killed the rank (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tuner.measure.driver.outcomes import collect_rank
from tuner.measure.driver.processes import RankProcess, stop_ranks
from tuner.measure.measurement import CANCELLED, INFRA_LOST, STOPPED_EARLY, RankResult
from tuner.measure.run_protocol import progress_path, result_path, timings_path


def sleeping_rank(tmp_path: Path) -> RankProcess:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    return RankProcess(0, process, tmp_path / "rank0.log")


def write_report(tmp_path: Path, result: RankResult, mtime: float) -> None:
    path = result_path(tmp_path, 0)
    path.write_text(json.dumps(asdict(result)))
    os.utime(path, (mtime, mtime))


def test_an_error_reported_after_the_cancel_signal_is_the_cancel(tmp_path: Path) -> None:
    """A rank unwinding from SIGTERM mid-import reported a RecursionError: the run was cancelled, not broken."""
    rank = sleeping_rank(tmp_path)
    rank.kill("cancelled")
    assert rank.signalled_at is not None
    write_report(tmp_path, RankResult(0, "error", exception_type="builtins.RecursionError"), rank.signalled_at + 0.5)
    assert collect_rank(tmp_path, rank).exception_type == CANCELLED


def test_an_error_reported_before_the_signal_is_kept(tmp_path: Path) -> None:
    """A rank that reported its OOM and was still tearing down when the timeout struck: the OOM stands."""
    rank = sleeping_rank(tmp_path)
    rank.kill("timeout")
    assert rank.signalled_at is not None
    write_report(tmp_path, RankResult(0, "oom", exception_type="torch.OutOfMemoryError"), rank.signalled_at - 5)
    outcome = collect_rank(tmp_path, rank)
    assert (outcome.status, outcome.exception_type) == ("oom", "torch.OutOfMemoryError")


def test_a_finished_report_is_kept_whenever_it_was_written(tmp_path: Path) -> None:
    rank = sleeping_rank(tmp_path)
    rank.kill("cancelled")
    write_report(tmp_path, RankResult(0, "ok"), time.time() + 1)
    assert collect_rank(tmp_path, rank).status == "ok"


def test_an_error_reported_after_the_stop_early_is_the_stop(tmp_path: Path) -> None:
    """Its peer was stopped first, so its collective broke and it reported that RuntimeError before its own stop
    arrived: the run was stopped early on purpose, and this rank's finished steps still count."""
    rank = sleeping_rank(tmp_path)
    rank.kill("stopped_early")
    assert rank.signalled_at is not None
    broken = RankResult(0, "error", exception_type="RuntimeError", error="Connection closed by peer")
    write_report(tmp_path, broken, rank.signalled_at + 0.2)
    outcome = collect_rank(tmp_path, rank)
    assert (outcome.status, outcome.exception_type) == ("ok", STOPPED_EARLY)


def test_an_error_reported_before_the_stop_early_is_kept(tmp_path: Path) -> None:
    rank = sleeping_rank(tmp_path)
    rank.kill("stopped_early")
    assert rank.signalled_at is not None
    write_report(tmp_path, RankResult(0, "oom", exception_type="torch.OutOfMemoryError"), rank.signalled_at - 5)
    assert collect_rank(tmp_path, rank).status == "oom"


def test_a_rank_stopped_early_reports_its_phases_steps_and_launch(tmp_path: Path) -> None:
    """What a rank left before its timed steps (phase timings, the threads and variables it ran with) and the steps
    it finished are its report: a run stopped early says what it was measured in, as a finished one does."""
    rank = sleeping_rank(tmp_path)
    launch = {"threads": 3, "affinity": [0, 1], "variables": {"OMP_NUM_THREADS": "3"}}
    timings_path(tmp_path, 0).write_text(json.dumps({"timings": {"warmup_s": 1.5}, "launch": launch}))
    progress_path(tmp_path, 0).write_text("0.25\n0.5\n")
    rank.kill("stopped_early")
    outcome = collect_rank(tmp_path, rank)
    assert (outcome.status, outcome.exception_type, outcome.step_times) == ("ok", STOPPED_EARLY, [0.25, 0.5])
    assert outcome.timings == {"warmup_s": 1.5, "timed_s": 0.75}
    assert outcome.launch == launch


def test_stopping_ranks_stamps_them_all_with_one_time(tmp_path: Path) -> None:
    """A peer's report written between two ranks' signals must not predate its own signal: one stop, one time."""
    ranks = [sleeping_rank(tmp_path) for _ in range(3)]
    stop_ranks(ranks, "stopped_early")
    assert len({rank.signalled_at for rank in ranks}) == 1 and ranks[0].signalled_at is not None


class LostProcess:
    """A forked rank whose fork server no longer answers (:class:`tuner.measure.forkserver.ForkedProcess`)."""

    pid, returncode, lost = 0, -9, "the fork server closed the connection"

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode


def test_a_rank_lost_with_its_fork_server_is_lost_infrastructure_unless_it_reported(tmp_path: Path) -> None:
    """Killed by its death signal when the server died: the infrastructure's failure, which the study retries; a
    report the rank wrote before (its own OOM, a finished run) still stands."""
    rank = RankProcess(0, LostProcess(), tmp_path / "rank0.log")  # type: ignore[arg-type]
    outcome = collect_rank(tmp_path, rank)
    assert (outcome.status, outcome.exception_type) == ("error", INFRA_LOST)
    assert "fork server was lost mid-run" in (outcome.error or "") and "signal 9" in (outcome.error or "")
    write_report(tmp_path, RankResult(0, "oom", exception_type="torch.OutOfMemoryError"), time.time())
    assert collect_rank(tmp_path, rank).status == "oom"


def test_a_run_with_a_rank_lost_to_its_infrastructure_is_lost_whatever_its_peers_said() -> None:
    """Either launcher: one rank's node, actor or fork server died, so its peers' broken collectives and the peer the
    launcher stopped follow from it; the run is InfraLost (which the study retries) and says which rank and why."""
    from tuner.measure.driver.outcomes import summarize
    from tuner.measure.measurement import PEER_KILLED
    from tuner.measure.run_protocol import RunSpec
    from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, workload_to_dict

    workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=3, device="cpu"), TrainSpec(32))
    spec = RunSpec(workload_to_dict(workload), {"train_micro_batch_size_per_gpu": 1}, device="cpu")
    results = [
        RankResult(0, "error", exception_type="RuntimeError", error="gloo: connection closed by peer", failed_at=1.0),
        RankResult(
            1, "error", exception_type=INFRA_LOST, error="its Ray node or actor was lost mid-run: ...", failed_at=2.0
        ),
        RankResult(2, "error", exception_type=PEER_KILLED, error="killed after another rank failed"),
    ]
    measurement = summarize(results, spec)
    assert (measurement.status, measurement.exception_type) == ("error", INFRA_LOST)
    assert measurement.error is not None and measurement.error.startswith("rank 1: its Ray node or actor was lost")
    assert summarize([RankResult(0, "oom"), RankResult(1, "ok")], spec).exception_type is None  # the config's own
