"""What a rank's end says: its own report (``RUN_DIR/rank-N.json``), or one made from how its process ended and why
the launcher stopped it; and the job's measurement from its ranks' results.

A rank that exits without writing its result is classified from its exit condition; one whose fork server died or
stopped answering mid-run is lost infrastructure (:data:`~tuner.measure.measurement.INFRA_LOST`), which the study
measures again, not the config's failure.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.estimator import resolve
from tuner.measure.driver.host_memory import HOST_MEMORY
from tuner.measure.driver.places import RankPlace
from tuner.measure.driver.processes import RankProcess
from tuner.measure.driver.rss_watch import OVER_MEMORY
from tuner.measure.layout_checks import with_tp_split
from tuner.measure.measurement import (
    CANCELLED,
    EXCERPT_CHARS,
    INFRA_LOST,
    PEER_KILLED,
    STOPPED_EARLY,
    Measurement,
    RankResult,
    aggregate,
)
from tuner.measure.oom import KILLED, exit_status
from tuner.measure.run_protocol import RunSpec, read_progress, result_path, timings_path
from tuner.units import format_bytes
from tuner.workload import workload_from_dict


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-EXCERPT_CHARS:]
    except FileNotFoundError:
        return ""


def placed(result: RankResult, place: RankPlace | None) -> RankResult:
    """``result`` with where its rank ran (node id, hostname, node rank, local rank)."""
    if place is not None:
        result.node_id, result.hostname = place.node_id, place.hostname
        result.node_rank, result.local_rank = place.node_rank, place.local_rank
    return result


def collect_rank(run_dir: Path, rank: RankProcess, oom_kills: int = 0) -> RankResult:
    """The rank's own report, or one made from how its process ended, with where it ran. ``oom_kills``: the OOM
    kills the kernel counted in the node's memory cgroup while the run lasted (:func:`.oom.exit_status`)."""
    return placed(_rank_outcome(run_dir, rank, oom_kills), rank.place)


STOPPED_BY_LAUNCHER = frozenset({"timeout", "peer", "cancelled", "stopped_early", OVER_MEMORY})
# file times come from the kernel's coarse clock, up to a tick (4 ms at 250 Hz) behind time.time()
MTIME_SLACK_S = 0.02


def _rank_outcome(run_dir: Path, rank: RankProcess, oom_kills: int = 0) -> RankResult:
    path = result_path(run_dir, rank.rank)
    if path.exists():
        report = RankResult.from_dict(json.loads(path.read_text()))
        # an error written after the launcher's signal (e.g. a RecursionError from an import SIGTERM interrupted, or
        # a collective broken by a peer stopped first) says how the rank died, not what the config did: then the
        # launcher's reason wins
        after_signal = rank.signalled_at is not None and path.stat().st_mtime >= rank.signalled_at - MTIME_SLACK_S
        if report.status == "ok" or rank.killed_for not in STOPPED_BY_LAUNCHER or not after_signal:
            return report
    code = rank.process.returncode
    if rank.killed_for == OVER_MEMORY and rank.over_memory is not None:
        held, cap = rank.over_memory
        why = (
            f"killed holding {format_bytes(held)} of this host's memory, past its cap of {format_bytes(cap)} (its "
            "share of the memory available when the run started)"
        )
        return RankResult(rank.rank, "oom", exception_type=HOST_MEMORY, error=why, failed_at=rank.signalled_at)
    if rank.killed_for == "timeout":
        return RankResult(rank.rank, "timeout", error=f"killed at the timeout\n{_tail(rank.log)}")
    if rank.killed_for == "peer":
        return RankResult(rank.rank, "error", exception_type=PEER_KILLED, error="killed after another rank failed")
    if rank.killed_for == "stopped_early":  # its phases up to the timed steps, and the steps it finished
        times = read_progress(run_dir, rank.rank)
        try:
            partial = json.loads(timings_path(run_dir, rank.rank).read_text())
        except (FileNotFoundError, ValueError):
            partial = {}
        stopped = RankResult(rank.rank, "ok", exception_type=STOPPED_EARLY, error="stopped early", step_times=times)
        stopped.timings = {**partial.get("timings", {}), "timed_s": sum(times)}
        stopped.launch = partial.get("launch", {})  # the threads and variables it ran with, as a finished rank says
        return stopped
    if rank.killed_for == "cancelled":
        return RankResult(rank.rank, "error", exception_type=CANCELLED, error="killed: the study was stopped")
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    lost = getattr(rank.process, "lost", None)  # its fork server died (its death signal took the rank) or hung
    if lost is not None:
        why = f"its node's fork server was lost mid-run ({lost}); the rank was {how}"
        return RankResult(rank.rank, "error", exception_type=INFRA_LOST, error=why, failed_at=rank.exited_at)
    tail = _tail(rank.log)
    status = exit_status(code, tail, oom_kills)
    if status == "oom" and code in KILLED:
        how += " with the kernel's OOM kill counted in its memory cgroup (the host ran out of memory)"
    return RankResult(rank.rank, status, exception_type="ProcessExit", error=f"{how}\n{tail}", failed_at=rank.exited_at)


def summarize(results: list[RankResult], spec: RunSpec) -> Measurement:
    """Aggregate rank results for ``spec``'s workload. A rank lost with its node, actor or fork server makes the
    whole run lost (``error`` / :data:`INFRA_LOST`, the cause in the error): its peers' broken collectives follow
    from it."""
    workload = workload_from_dict(spec.workload)
    samples = 0  # throughput is only computed for runs that DeepSpeed accepted and finished
    if all(result.status == "ok" for result in results):
        settings = resolve(with_tp_split(workload, spec.trial), spec.trial)
        samples = settings.global_batch
    measurement = aggregate(results, workload.model, workload.train.seq_len, samples, workload.cluster.world_size)
    measurement.stopped_early = any(result.exception_type == STOPPED_EARLY for result in results)
    lost = [result for result in results if result.exception_type == INFRA_LOST]
    if lost:
        measurement.status, measurement.exception_type = "error", INFRA_LOST
        measurement.error = f"rank {lost[0].rank}: {lost[0].error}"
    return measurement
