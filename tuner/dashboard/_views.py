"""What the dashboard pages show, computed from store records (no HTTP here, so it is easy to test and reuse)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tuner.forecast import PredictionAccuracy, group_counts, prediction_accuracy
from tuner.storage import FINISHED_STATUSES, JobRecord, StudyRecord, TrialRecord, WorkloadRecord
from tuner.units import format_bytes, memory_unit
from tuner.workload import UNKNOWN_FAMILY, TrialConfig

MEASURED_STATUSES = tuple(status for status in FINISHED_STATUSES if status != "pruned")


def format_rate(value: float | None) -> str:
    """Tokens per second for people: ``12,345``; ``None`` prints as ``-``."""
    return "-" if value is None else f"{value:,.0f}"


def format_percent(value: float | None, signed: bool = False) -> str:
    """A fraction as a percentage for people: ``12.3%`` (``+12.3%`` when ``signed``); ``None`` prints as ``-``."""
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def format_time(value: datetime | None) -> str:
    """A UTC timestamp to the minute: ``2024-05-01 13:45 UTC``; ``None`` prints as ``-``."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


def format_params(n_params: int) -> str:
    """A parameter count for people: ``124M``, ``6.74B``."""
    if n_params >= 10**9:
        return f"{n_params / 10**9:.2f}B"
    if n_params >= 10**6:
        return f"{n_params / 10**6:.0f}M"
    return f"{n_params:,}"


def describe_config(config: dict[str, Any]) -> str:
    """A one-line summary of a ds_config: ``ZeRO-2 · micro 4 × accum 2 · bf16 · optimizer → cpu``."""
    return TrialConfig(config).summary()


def describe_workload(workload: WorkloadRecord, with_length: bool = True) -> str:
    """``gpt2 (GPT2LMHeadModel) · 124M params · 2 × 24.00 GiB cuda · seq 1024`` (the architecture when known; the
    launch environment where it is not the default)."""
    train = workload.workload.get("train", {})
    architecture = workload.workload.get("model", {}).get("architecture")
    # a training command's own model (no --model): neither its size nor (without --seq-len) its length is known
    unknown = workload.workload.get("model", {}).get("family") == UNKNOWN_FAMILY
    parts = [
        workload.model_name + (f" ({architecture})" if architecture else ""),
        "its own model, not described" if unknown else f"{format_params(workload.n_params)} params",
        f"{workload.world_size} × {format_bytes(workload.gpu_memory)} {workload.device}",
    ]
    if "seq_len" in train and with_length and not unknown:
        parts.append(f"seq {train['seq_len']}")
    return " · ".join(parts + describe_launch(workload.workload.get("launch")))


def describe_launch(launch: dict[str, Any] | None) -> list[str]:
    """The launch environment where it is not the deepspeed launcher's rules unchanged: the launcher, bound cores,
    the names of the variables set (their values are the API token holder's to see, as in ``/v1/studies``).

    >>> describe_launch({"launcher": "torchrun", "bind_cores": True, "variables": {"OMP_NUM_THREADS": "1"}})
    ['launch torchrun', 'cores bound', 'sets OMP_NUM_THREADS']
    """
    if not launch:
        return []
    parts = [f"launch {launch.get('launcher', 'deepspeed')}"] + ["cores bound"] * bool(launch.get("bind_cores"))
    return parts + [f"sets {', '.join(sorted(launch['variables']))}"] * bool(launch.get("variables"))


def headroom(trial: TrialRecord | None, gpu_memory: int) -> int | None:
    """GPU memory left at the measured peak (negative when over), or None when nothing was measured."""
    if trial is None or trial.peak_bytes is None:
        return None
    return gpu_memory - trial.peak_bytes


@dataclass
class WorkloadSummary:
    """One line of the home page: a workload, its studies, and its best measured trial over all of them."""

    workload: WorkloadRecord
    studies: list[StudyRecord] = field(default_factory=list)
    best: TrialRecord | None = None
    best_study: StudyRecord | None = None
    measured: int = 0
    pruned: int = 0
    total: int = 0

    @property
    def description(self) -> str:
        return describe_workload(self.workload)

    @property
    def headroom(self) -> int | None:
        return headroom(self.best, self.workload.gpu_memory)


@dataclass
class JobView:
    """A tuning job as the home page shows it: status, progress against its budget, best so far, and errors."""

    job: JobRecord
    has_study: bool  # its study exists yet (a queued job's does not): link to it

    @property
    def progress(self) -> dict[str, Any]:
        return self.job.progress or {}

    @property
    def trials_text(self) -> str:
        budget = self.progress.get("budget", self.job.request.get("trials"))
        trials = self.progress.get("trials", 0)
        return f"{trials} / {budget}" if budget else str(trials)

    @property
    def best_tokens_per_s(self) -> float | None:
        return self.progress.get("best_tokens_per_s")

    @property
    def workload_text(self) -> str:
        """Model (preset, config's model_type or parameter count) on GPUs per node × nodes, sequence length."""
        workload = self.job.request.get("workload") or {}
        if workload.get("model"):
            model = str(workload["model"])
        elif workload.get("config"):
            model = f"{(workload['config'] or {}).get('model_type', 'custom')} config"
        else:
            model = f"{format_params(int(workload.get('params') or 0))} params"
        gpus = f"{workload.get('gpus', 1)}×{workload.get('nodes', 1)}"
        return f"{model} · {gpus} {workload.get('device', 'cuda')} · seq {workload.get('seq_len', 2048)}"


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The (memory, throughput, number) points no other point beats on both: less memory and more throughput.

    Returned by increasing memory (and so increasing throughput).

    Example:
        >>> pareto_front([(2.0, 10.0, 0), (1.0, 5.0, 1), (3.0, 8.0, 2), (1.5, 5.0, 3)])
        [(1.0, 5.0, 1), (2.0, 10.0, 0)]
    """
    front: list[tuple[float, float, int]] = []
    best = float("-inf")
    for point in sorted(points, key=lambda p: (p[0], -p[1], p[2])):
        if point[1] > best:
            front.append(point)
            best = point[1]
    return front


def _in(size: int | None, scale: int) -> float | None:
    return None if size is None else round(size / scale, 4)


def _wrap(label: str, width: int = 48) -> list[str] | str:
    lines = textwrap.wrap(label, width) or [label]
    return lines if len(lines) > 1 else lines[0]


def predicted_tokens_per_s(trial: TrialRecord) -> float | None:
    """The throughput model's tokens/s for the trial, as the study recorded it when the trial was proposed (with the
    constants fitted up to then); None for trials recorded before predictions were stored."""
    value = ((trial.estimate or {}).get("throughput") or {}).get("tokens_per_s")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def stopped_early(trial: TrialRecord) -> bool:
    """True when the throughput pruner stopped the trial's run: its figures come from its first timed steps only."""
    return bool((trial.measurement or {}).get("stopped_early"))


@dataclass(frozen=True)
class ThroughputRow:
    """One measured trial's predicted and measured tokens/s."""

    trial: TrialRecord
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """The signed relative error of the prediction: ``predicted / measured - 1``."""
        return self.predicted / self.measured - 1

    @property
    def stopped_early(self) -> bool:
        return stopped_early(self.trial)


@dataclass(frozen=True)
class ThroughputAccuracy:
    """Predicted against measured throughput over a study's measured trials (by trial number), with the summary."""

    rows: list[ThroughputRow]
    summary: PredictionAccuracy

    @property
    def stopped_early(self) -> int:
        """How many of the rows are runs stopped early."""
        return sum(row.stopped_early for row in self.rows)


def throughput_accuracy(trials: list[TrialRecord]) -> ThroughputAccuracy:
    """Every ok trial with a measured and a predicted tokens/s; runs stopped early count (their median step is a real
    measurement, and the throughput model learns from it too) and are marked."""
    rows = []
    for trial in sorted(trials, key=lambda t: (t.number, t.id)):
        predicted = predicted_tokens_per_s(trial)
        if trial.status == "ok" and trial.tokens_per_s and predicted is not None:
            rows.append(ThroughputRow(trial, predicted, trial.tokens_per_s))
    summary = prediction_accuracy([r.predicted for r in rows], [r.measured for r in rows])
    return ThroughputAccuracy(rows, summary)


def chart_data(trials: list[TrialRecord], pruned_reasons: dict[str, int], gpu_memory: int) -> dict[str, Any]:
    """Everything the study page's charts draw, as JSON-ready data (memory in ``memory_unit``, as tables read sizes).

    ``progress``: each measured trial's throughput and the best so far, by trial number. ``pareto``: throughput
    against measured peak memory, and the front. ``estimate``: estimated against measured peak memory per trial.
    ``throughput``: predicted against measured tokens/s per measured trial (:func:`throughput_accuracy`).
    ``reasons``: the histogram of prune reasons by kind (``GPU memory · backward · buffers``), most frequent first;
    older reasons with raw byte counts group the same way.
    """
    ordered = sorted(trials, key=lambda t: (t.number, t.id))
    ok = [t for t in ordered if t.status == "ok" and t.tokens_per_s is not None]
    best = None
    progress = []
    for trial in ordered:
        if trial.status not in FINISHED_STATUSES:
            continue
        if trial.status == "ok" and trial.tokens_per_s is not None:
            best = trial.tokens_per_s if best is None else max(best, trial.tokens_per_s)
        progress.append({"x": trial.number, "y": best})
    unit, scale = memory_unit(gpu_memory)
    points = [(t.peak_bytes / scale, t.tokens_per_s, t.number) for t in ok if t.peak_bytes is not None]
    front = pareto_front(points)  # type: ignore[arg-type]
    compared = [t for t in ordered if t.estimated_peak_bytes is not None and t.peak_bytes is not None]
    reasons = group_counts(pruned_reasons)
    return {
        "memory_unit": unit,  # MiB under a budget below 1 GiB, else GiB
        "progress": {
            "trials": [{"x": t.number, "y": t.tokens_per_s} for t in ok],
            "best": [p for p in progress if p["y"] is not None],
        },
        "pareto": {
            "trials": [{"x": round(m, 4), "y": y, "n": n} for m, y, n in points],
            "front": [{"x": round(m, 4), "y": y, "n": n} for m, y, n in front],
        },
        "estimate": {
            "trials": [
                {"x": x, "y": y, "n": t.number, "status": t.status}
                for t in compared
                for x, y in [(_in(t.estimated_peak_bytes, scale), _in(t.peak_bytes, scale))]
            ],
        },
        "throughput": {
            "trials": [
                {"x": r.predicted, "y": r.measured, "n": r.trial.number, "stopped_early": r.stopped_early}
                for r in throughput_accuracy(trials).rows
            ],
        },
        "reasons": {"labels": [_wrap(r) for r in reasons], "counts": list(reasons.values())},
    }


def estimate_quality(trials: list[TrialRecord]) -> dict[str, Any]:
    """How good the pruning is: measured/estimated peak ratios, and the OOMs the estimate said would fit."""
    ratios = sorted(
        t.peak_bytes / t.estimated_peak_bytes
        for t in trials
        if t.peak_bytes is not None and t.estimated_peak_bytes and t.status in MEASURED_STATUSES
    )
    missed = [t.number for t in trials if t.status == "oom" and (t.estimate or {}).get("fits", True)]
    return {
        "compared": len(ratios),
        "median": ratios[len(ratios) // 2] if ratios else None,
        "low": ratios[0] if ratios else None,
        "high": ratios[-1] if ratios else None,
        "under": sum(r > 1 for r in ratios),
        "missed_ooms": missed,
    }


def sort_value(value: Any) -> str:
    """The ``data-value`` a table cell sorts by ('' sorts last)."""
    return "" if value is None else str(value)


@dataclass
class RankRow:
    """One rank of a measured trial, as the trial page shows it (from the stored measurement's ``ranks``)."""

    rank: int
    status: str
    node_id: str | None
    hostname: str | None
    node_rank: int | None
    local_rank: int | None
    peak_bytes: int | None
    peak_rss_bytes: int | None
    step_times: list[float]
    error: str | None

    @property
    def step_p50(self) -> float | None:
        """The rank's median timed step, seconds."""
        ordered = sorted(self.step_times)
        return ordered[len(ordered) // 2] if ordered else None


def rank_rows(measurement: dict[str, Any] | None) -> list[RankRow]:
    """The rank report of a stored measurement (empty when the trial was not measured or predates it)."""
    rows = []
    for rank in (measurement or {}).get("ranks") or []:
        error = rank.get("error")
        rows.append(
            RankRow(
                rank=rank["rank"],
                status=rank.get("status", "-"),
                node_id=rank.get("node_id"),
                hostname=rank.get("hostname"),
                node_rank=rank.get("node_rank"),
                local_rank=rank.get("local_rank"),
                peak_bytes=rank.get("peak_bytes"),
                peak_rss_bytes=rank.get("peak_rss_bytes", rank.get("peak_rss")),
                step_times=list(rank.get("step_times") or []),
                error=error.strip().splitlines()[-1] if error and error.strip() else None,
            )
        )
    return rows


COST_LABELS = {
    "start_s": "Process start",
    "imports_s": "Imports",
    "distributed_s": "Process group",
    "model_s": "Model build",
    "initialize_s": "deepspeed.initialize",
    "warmup_s": "Warm-up",
    "timed_s": "Timed steps",
    "other_s": "Launcher and teardown",
}
BREAKDOWN_LABELS = {"forward_s": "Forward", "backward_s": "Backward", "step_s": "Optimizer step"}


@dataclass
class CostRow:
    """One phase of a measured trial's cost: seconds and share of the wall time."""

    phase: str
    seconds: float
    share: float | None


def cost_rows(measurement: dict[str, Any] | None) -> tuple[list[CostRow], dict[str, float]]:
    """What the trial cost, phase by phase (in run order, then the launcher's rest), and the wall and overhead
    seconds; empty when the trial was not measured or predates cost reports."""
    cost = (measurement or {}).get("cost") or {}
    wall = cost.get("wall_s")
    rows = [
        CostRow(label, cost[key], cost[key] / wall if wall else None)
        for key, label in COST_LABELS.items()
        if key in cost
    ]
    totals = {key: cost[key] for key in ("wall_s", "overhead_s") if key in cost}
    return rows, totals


def numerics_rows(measurement: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The step-0 loss and global gradient norm beside the study's reference run's (:mod:`tuner.study.numerics_guard`),
    with the relative difference: one row per figure, empty for a run measured without them."""
    numerics = (measurement or {}).get("numerics") or {}
    if numerics.get("step0_loss") is None:
        return []
    reference = numerics.get("reference") or {}
    rows = []
    for key, rel, label in (
        ("step0_loss", "loss_rel", "Step-0 loss"),
        ("step0_grad_norm", "grad_norm_rel", "Step-0 gradient norm"),
    ):
        rows.append(
            {"label": label, "value": numerics.get(key), "reference": reference.get(key), "rel": numerics.get(rel)}
        )
    return rows


def breakdown_rows(measurement: dict[str, Any] | None) -> list[tuple[str, float]]:
    """DeepSpeed's forward / backward / step seconds per timed step (``wall_clock_breakdown``), if stored."""
    breakdown = (measurement or {}).get("breakdown") or {}
    return [(label, breakdown[key]) for key, label in BREAKDOWN_LABELS.items() if key in breakdown]
