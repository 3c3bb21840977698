"""What a measured run reports: per-rank results and the job-level measurement built from them (pure Python)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.estimator import model_flops_per_token, peak_tflops
from tuner.measure.oom import follows_peer
from tuner.workload import ModelSpec

# Tie-breaker between failures at the same moment (the earliest failure explains a job best).
STATUS_PRIORITY = {"invalid_config": 0, "oom": 1, "timeout": 2, "error": 3, "ok": 4}
EXCERPT_CHARS = 1500
# A trial's phases in order, as ranks time them (seconds; the slowest rank's): process start up to the rank's main,
# importing torch and DeepSpeed, the process group, building the model, deepspeed.initialize, warm-up, timed steps.
COST_PHASES = ("start_s", "imports_s", "distributed_s", "model_s", "initialize_s", "warmup_s", "timed_s")
# what the warm-up is made of (a rank's timings, slowest rank each): its first step, the memory probe's step and the
# probe's sweeps within it, garbage collected before steps while the true peak is counted, the step-0 numerics, and
# the true peak's read-back after warm-up (outside warmup_s)
WARMUP_PARTS = ("warmup_first_s", "warmup_probe_s", "probe_sweeps_s", "warmup_gc_s", "numerics_s", "peak_readback_s")
PEER_KILLED = "KilledAfterPeerFailure"  # a rank the launcher stopped because another rank failed first
CANCELLED = "Cancelled"  # a rank the launcher killed because the study was stopped (not the config's fault)
# a rank's node, Ray actor, launcher or fork server died mid-run: the infrastructure's fault, not the config's, so the
# study records the run failed and measures the config again (the error says which part was lost)
INFRA_LOST = "InfraLost"
STOPPED_EARLY = "StoppedEarly"  # a rank stopped on purpose mid-run (clearly slow): status ok, its partial step times
# Called with rank 0's timed step times so far (seconds), polled while a run goes on; True stops the run early.
StepHook = Callable[[list[float]], bool]


class InvalidConfig(Exception):
    """The rank refuses the config: DeepSpeed rejected it (the message is DeepSpeed's own), or it asks what a
    measured run cannot do (:func:`tuner.measure.long_context_checks.measured_refusal`)."""


@dataclass
class RankResult:
    """One rank's report. Sizes in bytes, times in seconds.

    Where it ran: ``node_id`` (Ray's node id; None for the local launcher), ``hostname``, ``node_rank`` and
    ``local_rank`` (its index among the job's ranks on that node), filled in by the launcher. ``rss_bytes`` is the
    rank's resident set at ``before_model``, ``after_model`` and ``after_initialize``; ``peak_rss_bytes`` its peak.

    ``true_peak_bytes`` is the allocator's own peak of live tensor bytes (:mod:`tuner.measure.rank.true_peak`: CPU
    profiler memory events from before the model is built to the end of warm-up; CUDA ``max_memory_allocated``),
    transients included; ``true_peak`` says how it was measured and carries the OS high-water mark (``vm_hwm_bytes``,
    ``ru_maxrss_bytes``), on CUDA the reserved peak, allocator counters and NVML's process bytes. ``snapshots``
    (live storages by category at the end of forward, backward and step) explain it by category.
    """

    rank: int
    status: str
    exception_type: str | None = None
    error: str | None = None
    step_times: list[float] = field(default_factory=list)
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    model_state_bytes: int | None = None
    activation_bytes: int | None = None
    peak_rss_bytes: int | None = None
    device_name: str | None = None
    failed_at: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    snapshots: dict[str, dict[str, int]] = field(default_factory=dict)
    rss_bytes: dict[str, int] = field(default_factory=dict)
    warmup_steps: int | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    node_id: str | None = None
    hostname: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    true_peak_bytes: int | None = None
    true_peak: dict[str, Any] = field(default_factory=dict)
    trainable_params: int | None = None  # with an adapter or frozen parameters: the elements that train
    numerics: dict[str, Any] = field(
        default_factory=dict
    )  # tuner.measure.rank.numerics.first_step_numerics (all ranks')
    # the rank's place in the layout (sequence_parallel, sp_rank, data_parallel, dp_rank; with AutoTP also
    # tensor_parallel, tp_rank) and the tokens it trains on per micro-batch (s/sp × micro-batch: under Ulysses each
    # rank holds its share of a sample)
    layout: dict[str, int] = field(default_factory=dict)
    local_params: int | None = None  # parameter elements the rank holds after AutoTP shards them (ZeRO-3: ds_numel)
    tokens_per_micro_batch: int | None = None
    launch: dict[str, Any] = field(default_factory=dict)  # threads, affinity, variables (tuner.measure.rank.launch_env)
    script: dict[str, Any] = field(default_factory=dict)  # a training command's rank: what it fed and its engine's

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        """Rebuild from JSON, ignoring unknown keys (``peak_rss`` is the old name of ``peak_rss_bytes``)."""
        data = {"peak_rss_bytes": data.get("peak_rss"), **data}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus ``peak_bytes`` (the rank report's entry in ``dstune measure --json``)."""
        return {**asdict(self), "peak_bytes": self.peak_bytes}

    @property
    def peak_bytes(self) -> int | None:
        """The true peak (CUDA: ``max_memory_allocated``; CPU: the allocator's records); a run measured without it
        falls back to its largest phase snapshot (model states and buffers held plus the saved activations)."""
        if self.peak_allocated is not None:
            return self.peak_allocated
        if self.true_peak_bytes is not None:
            return self.true_peak_bytes
        if self.model_state_bytes is None:
            return None
        return self.model_state_bytes + (self.activation_bytes or 0)


@dataclass
class Measurement:
    """The result of one measured run (the ``dstune measure --json`` object, less the estimate)."""

    status: str
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_time_s: dict[str, float] | None = None
    tflops_per_device: float | None = None
    mfu: float | None = None
    peak_bytes_per_rank: list[int | None] = field(default_factory=list)
    error: str | None = None
    exception_type: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    ranks: list[RankResult] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False
    # the step-0 loss and gradient norm and the losses (tuner.measure.rank.numerics); the study adds its verdict
    numerics: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)  # the launch it ran in (tuner.measure.driver.launch_env)
    # the user's training command measured instead of dstune's trainer (tuner.measure.backends.script): its figures
    script: dict[str, Any] = field(default_factory=dict)

    def set_wall(self, wall_s: float) -> None:
        """Record the run's wall time and derive :attr:`cost` from it (:func:`trial_cost`)."""
        self.timings["wall_s"] = wall_s
        self.cost = trial_cost(self.timings)

    def to_dict(self, with_ranks: bool = True) -> dict[str, Any]:
        """JSON-ready fields."""
        data = asdict(self)
        data["ranks"] = [rank.to_dict() for rank in self.ranks]
        if not with_ranks:
            data.pop("ranks")
        return data


def trial_cost(timings: dict[str, float]) -> dict[str, float]:
    """What a trial cost, in seconds: each phase of :data:`COST_PHASES` the ranks timed, ``wall_s`` (the launcher's
    whole run), ``overhead_s`` (wall − timed: everything that is not measurement) and ``other_s`` (wall − the phases:
    launcher, placement, teardown).

    >>> cost = trial_cost({"imports_s": 3.0, "initialize_s": 2.0, "timed_s": 5.0, "wall_s": 12.0})
    >>> cost["overhead_s"], cost["other_s"]
    (7.0, 2.0)
    """
    cost = {phase: timings[phase] for phase in COST_PHASES if phase in timings}
    wall = timings.get("wall_s")
    if wall is not None:
        cost["wall_s"] = wall
        cost["overhead_s"] = wall - cost.get("timed_s", 0.0)
        cost["other_s"] = max(0.0, wall - sum(cost[phase] for phase in COST_PHASES if phase in cost))
    return cost


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` with linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _blame_order(result: RankResult) -> tuple[bool, float, int, int]:
    """Sort key for the root cause: not a peer the launcher killed nor one whose collective broke when a peer went
    (:func:`tuner.measure.oom.follows_peer`: a watchdog's abort after a peer's OOM), failed first, then by status
    and rank.

    A rank's crash breaks its peers' collectives a moment later, so the earliest failure is the cause.
    """
    failed_at = result.failed_at if result.failed_at is not None else float("inf")
    follower = result.exception_type == PEER_KILLED or follows_peer(result.error or "")
    return follower, failed_at, STATUS_PRIORITY.get(result.status, 3), result.rank


def aggregate(
    ranks: list[RankResult], model: ModelSpec, seq_len: int | None, samples_per_step: int, world_size: int
) -> Measurement:
    """Combine rank results into the job's measurement.

    A step takes as long as its slowest rank; throughput uses the median step time over the timed steps. Model
    FLOPs count the weight gradients of the parameters that trained (``trainable_params``, as the prediction does).
    ``seq_len`` None (a training command whose tokens per sample are unknown): samples/s only; an unknown model
    (:attr:`~tuner.workload.ModelSpec.is_unknown`): no model FLOPs.
    """
    ranks = sorted(ranks, key=lambda result: result.rank)
    failed = [r for r in ranks if r.status != "ok"]
    timings = {key: max(r.timings.get(key, 0.0) for r in ranks) for key in {k for r in ranks for k in r.timings}}
    peaks = [r.peak_bytes for r in ranks]
    breakdown = {key: max(r.breakdown.get(key, 0.0) for r in ranks) for key in {k for r in ranks for k in r.breakdown}}
    if failed:
        cause = min(failed, key=_blame_order)
        return Measurement(
            status=cause.status,
            error=cause.error,
            exception_type=cause.exception_type,
            peak_bytes_per_rank=peaks,
            timings=timings,
            ranks=ranks,
        )
    steps = min(len(r.step_times) for r in ranks) if ranks else 0
    if steps == 0:
        return Measurement(status="ok", peak_bytes_per_rank=peaks, timings=timings, ranks=ranks)
    step_times = [max(r.step_times[i] for r in ranks) for i in range(steps)]
    p50 = percentile(step_times, 0.5)
    tokens_per_step = samples_per_step * seq_len if seq_len is not None else None
    trainable = next((r.trainable_params for r in ranks if r.trainable_params is not None), None)
    tflops = None
    if tokens_per_step is not None and seq_len is not None and not model.is_unknown:
        tflops = model_flops_per_token(model, seq_len, trainable) * tokens_per_step / world_size / p50 / 1e12
    peak = peak_tflops(ranks[0].device_name)
    return Measurement(
        status="ok",
        tokens_per_s=tokens_per_step / p50 if tokens_per_step is not None else None,
        samples_per_s=samples_per_step / p50,
        step_time_s={"p50": p50, "p90": percentile(step_times, 0.9)},
        tflops_per_device=tflops,
        mfu=tflops / peak if peak and tflops is not None else None,
        peak_bytes_per_rank=peaks,
        timings=timings,
        ranks=ranks,
        breakdown=breakdown,
        numerics=dict(ranks[0].numerics),
    )
