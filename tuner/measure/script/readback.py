"""What a training command's ranks wrote, read back as the run's measurement (the same
:class:`~tuner.measure.measurement.Measurement` the built-in trainer's runs give)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.measure.measurement import EXCERPT_CHARS, STOPPED_EARLY, Measurement, RankResult, aggregate
from tuner.measure.run_protocol import read_progress
from tuner.measure.script.failures import SCRIPT_FAILED, CommandEnd, classify_end
from tuner.workload import Workload


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rank_results(run_dir: Path) -> list[RankResult]:
    """The rank results written (``rank-N.json``), by rank."""
    found = [_read(path) for path in run_dir.glob("rank-*.json")]
    return sorted((RankResult.from_dict(data) for data in found if data), key=lambda result: result.rank)


def error_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of processes that ended on an exception, earliest first."""
    found = [_read(path) for path in run_dir.glob("error-*.json")]
    return sorted((data for data in found if data), key=lambda record: record.get("at", 0.0))


def log_tail(run_dir: Path) -> str:
    """The end of the command's output."""
    try:
        return (run_dir / "command.log").read_text(errors="replace")[-EXCERPT_CHARS:]
    except OSError:
        return ""


def read_back(
    run_dir: Path,
    workload: Workload,
    killed_for: str | None,
    exit_code: int | None,
    timeout: float,
    seq_len_known: bool = True,
    over_memory: tuple[int, int] | None = None,
) -> Measurement:
    """The command's measurement: every rank ok gives throughput (samples per step as DeepSpeed counts them: micro ×
    accumulation × data-parallel ranks; tokens from the token ids its forward saw, else ``--seq-len`` per sample;
    samples/s only when neither is known: ``seq_len_known`` False), step times and each rank's peak; otherwise the
    failure :func:`~tuner.measure.script.failures.classify_end` finds."""
    world = workload.cluster.world_size
    results = rank_results(run_dir)
    ran = next((r.script.get("world_size") for r in results if r.script.get("world_size")), world)
    if ran != world:
        line = f"the command ran {ran} ranks where --gpus × --nodes say {world}: give both the same count"
        return Measurement(status="error", exception_type=SCRIPT_FAILED, error=line, ranks=results)
    if killed_for == "stopped_early":
        results = [_stopped(run_dir, rank) for rank in range(world)]
    if len(results) == world and all(result.status == "ok" for result in results):
        return _measured(results, workload, seq_len_known)
    failed = [result for result in results if result.status != "ok"]
    if failed and killed_for is None:  # a rank ended its script early, by its own report
        first = failed[0]
        return Measurement(
            status="error",
            exception_type=first.exception_type,
            error=first.error,
            ranks=results,
            peak_bytes_per_rank=[r.peak_bytes for r in results],
        )
    initialized = any(run_dir.glob("init-*"))
    end = CommandEnd(killed_for, exit_code, error_records(run_dir), initialized, log_tail(run_dir), over_memory)
    status, kind, line = classify_end(end, timeout)
    return Measurement(
        status=status,
        exception_type=kind,
        error=line,
        ranks=results,
        peak_bytes_per_rank=[r.peak_bytes for r in results],
    )


def _stopped(run_dir: Path, rank: int) -> RankResult:
    """A rank stopped early on purpose: its timed steps so far and its engine's batch (no peak: it never reported)."""
    times = read_progress(run_dir, rank)
    result = RankResult(rank, "ok", exception_type=STOPPED_EARLY, error="stopped early", step_times=times)
    result.timings = {"timed_s": sum(times)}
    result.script = _read(run_dir / f"init-{rank}") or {}
    return result


def _tokens_from(tokens: int, known: bool) -> str:
    if tokens:
        return "the token ids the model's forward saw"
    return "--seq-len (no token ids seen)" if known else "unknown: no token ids seen and no --seq-len (samples/s only)"


def _measured(results: list[RankResult], workload: Workload, seq_len_known: bool = True) -> Measurement:
    first = results[0].script
    samples = int(first.get("train_batch_size") or 0)
    seen = [result.script.get("seen", {}) for result in results]
    tokens, fed = sum(s.get("tokens", 0) for s in seen), sum(s.get("samples", 0) for s in seen)
    given = workload.train.seq_len if seq_len_known else None
    seq_len = round(tokens / fed) if tokens and fed else given
    measurement = aggregate(results, workload.model, seq_len, samples, workload.cluster.world_size)
    measurement.stopped_early = any(result.exception_type == STOPPED_EARLY for result in results)
    micro_fed = max((s.get("samples", 0) / s["micro_batches"] for s in seen if s.get("micro_batches")), default=None)
    measurement.script = {
        "samples_per_step": samples,
        "tokens_per_sample": seq_len,
        "tokens_from": _tokens_from(tokens, seq_len_known),
        "longest_sequence_seen": max((s.get("longest", 0) for s in seen), default=0) or None,
        "micro_batch_fed": micro_fed,
        "micro_batch_config": first.get("micro_batch"),
        "world_size": first.get("world_size"),
        "code_paths": first.get("code_paths"),  # DeepSpeed's chunked loss, Liger's kernels: seen on the model or not
    }
    return measurement
