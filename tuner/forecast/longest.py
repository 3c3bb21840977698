"""The longest sequence that fits: for a workload, over the layouts and configs the pins allow
(:mod:`tuner.forecast.seq_candidates`), the longest length (a multiple of 256, or of what the layout requires) at
which the estimator says training fits, the config that reaches it, its estimate there and the next limit.

How it searches (:func:`longest_fit`): memory grows with the length, so for each candidate the lengths that fit are
a prefix; the search gallops (doubling) from the shortest length, then bisects. Candidates are tried the most
memory-saving first; each later one is first probed at the incumbent's length: if it does not fit there it cannot
beat it (monotonicity) and costs one estimate, if it fits it is probed one step further, and searched on only when it
fits there too. Candidates that reach the same length are ranked by the throughput model's prediction at that
length (:func:`tuner.estimator.predict`), then by fewer model-parallel ranks, offloads and savers. A
candidate the estimator refuses (:class:`~tuner.workload.ConfigError`, :class:`~tuner.errors.InputError`: a layout
it does not accept or model) is not considered; the answer counts them.

What the estimator models decides the answer: :func:`modelled` checks, on this workload, whether Ulysses, the tiled
MLP and loss and checkpoint offload change its estimate at all, and the answer says which do not (they then tie with
their plain counterparts and lose on predicted throughput, or on simplicity).

A margin (``margin``: the fraction the estimated peak is inflated by before it is compared with the GPU's memory,
as :class:`tuner.forecast.Calibration` checks a fit; the faces default to :data:`tuner.forecast.DEFAULT_MARGIN`)
keeps that much free, and the next limit then says where the margin is what the next length exceeds.

A rotary model's ``max_position_embeddings`` does not cap the search: memory does not depend on it, and long-context
training extends the positions (RoPE scaling); the answer says when it lies beyond (``beyond_max_positions``). A
learned position table (GPT-2's ``wpe``) does: no scaling extends it, so the search stops at its rows and the next
limit says so (``positions``). The search stops at :data:`SEARCH_CAP` tokens. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tuner.errors import InputError
from tuner.estimator import ConfigError, MemoryEstimate, estimate, predict
from tuner.forecast.calibration import Calibration
from tuner.forecast.next_limit import NextLimit, next_limit
from tuner.forecast.seq_candidates import Candidate, Pins, candidates
from tuner.forecast.seq_scaling import SeqSizer
from tuner.workload import MAX_SEQ_LEN, TrialConfig, Workload
from tuner.workload.layouts import ULYSSES

SEARCH_CAP = MAX_SEQ_LEN  # tokens: 67M, beyond any published run; --seq-len's own bound
Fits = Callable[[MemoryEstimate], bool]


class NoLengthFits(Exception):
    """Not even the shortest length fits under any candidate the pins allow."""


@dataclass(frozen=True)
class LongestFit:
    """The answer of :func:`longest_fit`."""

    seq_len: int
    multiple: int
    candidate: Candidate
    trial: TrialConfig
    workload: Workload  # at seq_len
    estimate: MemoryEstimate
    next_limit: NextLimit
    tokens_per_s: float | None
    modelled: dict[str, bool | None]
    candidates: int
    refused: int
    tied: int
    estimates: int
    margin: float = 0.0

    @property
    def max_positions(self) -> int:
        """The model's ``max_position_embeddings`` (0: unknown)."""
        return self.workload.model.max_positions

    @property
    def beyond_max_positions(self) -> bool:
        """Whether the answer is longer than the model's positions (training there extends them: RoPE scaling)."""
        return 0 < self.max_positions < self.seq_len

    def notes(self) -> list[str]:
        """What the figure does not account for, in words."""
        notes = [
            f"{name.replace('_', ' ')} is not modelled by this estimator: it changes no activation or buffer byte"
            for name, known in self.modelled.items()
            if known is False
        ]
        if self.beyond_max_positions:
            notes.append(
                f"longer than the model's max_position_embeddings ({self.max_positions}): training there needs "
                "position extension (RoPE scaling); memory does not depend on it"
            )
        if self.next_limit.memory == "cap":
            notes.append(f"the search stops at {SEARCH_CAP} tokens")
        return notes

    def to_dict(self) -> dict[str, Any]:
        """The ``max_seq_len`` object of ``dstune estimate --max-seq-len --json`` and the API."""
        layout, long_context = self.trial.layout, self.trial.long_context
        return {
            "seq_len": self.seq_len,
            "multiple": self.multiple,
            "ds_config": self.trial.ds_config,
            "activation_checkpointing": self.trial.activation_checkpointing,
            "summary": self.trial.summary(),
            ULYSSES.field: layout.degree(ULYSSES),
            "data_parallel": layout.data_parallel(self.workload.cluster.world_size),
            "tiled_mlp_shards": long_context.tiled_mlp_shards,
            "tiled_loss_shards": long_context.tiled_loss_shards,
            "offload_checkpoints": long_context.offload_checkpoints,
            "gpu_total": self.estimate.gpu_total,
            "headroom": self.estimate.headroom,
            "predicted_tokens_per_s": self.tokens_per_s,
            "next_limit": self.next_limit.to_dict(),
            "max_positions": self.max_positions,
            "beyond_max_positions": self.beyond_max_positions,
            "modelled": dict(self.modelled),
            "notes": self.notes(),
            "candidates": self.candidates,
            "refused": self.refused,
            "tied": self.tied,
            "estimates": self.estimates,
            "margin": self.margin,
        }


class _Search:
    """The probes of one search: estimates by (candidate, length), refusals counted."""

    def __init__(self, sizer: SeqSizer, pins: Pins, fits: Fits, cap: int, margin: float = 0.0) -> None:
        self.sizer, self.pins, self.fits, self.cap, self.margin = sizer, pins, fits, cap, margin
        self.estimates = 0
        self.refusals: dict[Candidate, str] = {}

    def probe(self, candidate: Candidate, seq_len: int) -> tuple[TrialConfig, MemoryEstimate] | None:
        """The trial and its estimate at ``seq_len``; None when the estimator refuses it."""
        workload = self.sizer.at(seq_len)
        self.estimates += 1
        try:
            trial = candidate.trial(workload, seq_len, self.pins)
            return trial, estimate(workload, trial)
        except (ConfigError, InputError) as error:
            self.refusals.setdefault(candidate, f"{error.field}: {error.message}")
            return None

    def ok(self, candidate: Candidate, seq_len: int) -> bool:
        found = self.probe(candidate, seq_len)
        return found is not None and self.fits(found[1])

    def longest(self, candidate: Candidate, floor: int) -> int | None:
        """The longest multiple of the candidate's that fits, if one at least ``floor`` does; else None."""
        step = candidate.multiple
        top = self.cap // step
        low = max(1, -(-floor // step))
        if low > top or not self.ok(candidate, low * step):
            return None
        high, stride = None, 1
        while high is None and low < top:  # gallop
            nxt = min(low + stride, top)
            if self.ok(candidate, nxt * step):
                low, stride = nxt, stride * 2
            else:
                high = nxt
        while high is not None and high - low > 1:  # bisect
            mid = (low + high) // 2
            if self.ok(candidate, mid * step):
                low = mid
            else:
                high = mid
        return low * step


def fits_within(margin: float) -> Fits:
    """Whether an estimate fits with ``margin``: its GPU peak times 1 + margin within the GPU's memory (the check
    :class:`Calibration` makes of a study's trial and the recommender's answer), and the node's host memory holding
    its share.

    >>> from tuner.workload import ClusterSpec, TrialConfig, Workload, load_builtin_model
    >>> est = estimate(Workload(load_builtin_model("gpt2"), ClusterSpec()), TrialConfig({}))
    >>> fits_within(0.0)(est), fits_within(est.gpu_memory / est.gpu_total)(est)
    (True, False)
    """
    checked = Calibration(margin=margin)
    return lambda est: checked.fits(est.gpu_total, est.gpu_memory) and est.cpu_headroom >= 0


def longest_fit(
    workload: Workload,
    pins: Pins | None = None,
    margin: float = 0.0,
    factors: Mapping[str, float] | None = None,
    cap: int = SEARCH_CAP,
) -> LongestFit:
    """The longest sequence ``workload`` trains at on its cluster (module docstring).

    Args:
        workload: The workload; its own ``seq_len`` is ignored. A transformers model's profile must hold traced
            lengths to extrapolate from (:data:`tuner.forecast.seq_scaling.TRACE_LENGTHS`).
        pins: What the user fixed (default: everything searched, micro-batch 1).
        margin: The share of the estimated GPU peak kept free beside it (:func:`fits_within`; the faces default
            to :data:`~tuner.forecast.DEFAULT_MARGIN`, the recommender its calibrated one; 0: the estimate's fit).
        factors: The throughput model's fitted factors, for ranking ties.
        cap: Stop searching at this many tokens (a learned position table stops it at its rows).
    Raises:
        NoLengthFits: nothing fits at the shortest length.

    Example:
        >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
        >>> answer = longest_fit(Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8)),
        ...                      Pins(stage=3, sp=1))
        >>> answer.seq_len % 256, answer.trial.stage, answer.next_limit.memory
        (0, 3, 'cpu')
    """
    pins = pins or Pins()
    pool = list(candidates(workload, pins))
    sizer = SeqSizer(workload, {c.sp for c in pool})
    search = _Search(sizer, pins, fits_within(margin), min(cap, workload.model.position_limit or cap), margin)
    best, tied = 0, []
    for candidate in pool:
        found = search.longest(candidate, best)
        if found is None:
            continue
        if found > best:
            best, tied = found, [candidate]
        elif found == best:
            tied.append(candidate)
    if not tied:
        raise NoLengthFits(_nothing_fits(search, pool))
    winner, tokens = _rank(search, tied, best, factors)
    trial, est = search.probe(winner, best) or _never()  # it fit at best
    return LongestFit(
        seq_len=best,
        multiple=winner.multiple,
        candidate=winner,
        trial=trial,
        workload=sizer.at(best),
        estimate=est,
        next_limit=next_limit(search, winner, best, est),
        tokens_per_s=tokens,
        modelled=modelled(workload, pins),
        candidates=len(pool),
        refused=_refused(search, pool),
        tied=len(tied),
        estimates=search.estimates,
        margin=margin,
    )


def _never() -> tuple[TrialConfig, MemoryEstimate]:
    raise AssertionError("the winner fitted at its length")


def _refused(search: _Search, pool: list[Candidate]) -> int:
    """Candidates the estimator refused at their shortest length (not considered)."""
    return sum(1 for c in pool if c in search.refusals and search.probe(c, c.multiple) is None)


def _rank(
    search: _Search, tied: list[Candidate], seq_len: int, factors: Mapping[str, float] | None
) -> tuple[Candidate, float | None]:
    """The best of the candidates that reach ``seq_len``: highest predicted tokens/s, then the simplest."""
    workload = search.sizer.at(seq_len)
    speeds: dict[Candidate, float | None] = {}
    for candidate in tied:
        try:
            speeds[candidate] = predict(workload, candidate.trial(workload, seq_len, search.pins), factors).tokens_per_s
        except (ConfigError, InputError, ArithmeticError, ValueError):
            speeds[candidate] = None

    def key(c: Candidate) -> tuple[float, int, int, int, int]:
        speed = speeds[c]
        return (-(speed or 0.0), c.sp, c.offloads, c.features, c.stage)

    winner = min(tied, key=key)
    return winner, speeds[winner]


def _nothing_fits(search: _Search, pool: list[Candidate]) -> str:
    """Why nothing fits: a learned position table shorter than any length searched, the overflow of the most
    memory-saving candidate the estimator accepts at the shortest length, or the refusals."""
    model, shortest = search.sizer.at(search.cap).model, min((c.multiple for c in pool), default=0)
    if 0 < model.position_limit < shortest:
        limit = model.position_limit
        return f"{model.name} learned {limit} positions, fewer than the shortest length searched ({shortest})"
    for candidate in pool:
        found = search.probe(candidate, candidate.multiple)
        if found is not None:
            return (
                f"nothing fits even at {candidate.multiple} tokens: {found[0].summary()}: "
                f"{found[1].overflow_reason() or 'over the margin'}"
            )
    reasons = "; ".join(sorted(set(search.refusals.values()))[:3])
    return f"the estimator refuses every candidate layout ({reasons})"


def modelled(workload: Workload, pins: Pins | None = None) -> dict[str, bool | None]:
    """Whether the estimator's bytes change, on this workload at 4,096 tokens (ZeRO-3, checkpointing), with Ulysses
    at sp=2, the tiled MLP and loss (4 shards) and checkpoint offload; None where it cannot tell (sp=2 not possible
    here, or refused)."""
    sizer = SeqSizer(workload, (1, 2))
    plain = Candidate(3, "none", "none", True, 1, 1, 1, False, (pins or Pins()).micro_batch)
    variants = {
        ULYSSES.field: replace(plain, sp=2),
        "tiled_mlp": replace(plain, tiled_mlp=4),
        "tiled_loss": replace(plain, tiled_loss=4),
        "offload_checkpoints": replace(plain, offload_checkpoints=True),
    }
    search = _Search(sizer, Pins(ds_config=(pins or Pins()).ds_config), lambda est: est.fits, SEARCH_CAP)
    base = search.probe(plain, 4096)
    answer: dict[str, bool | None] = {}
    for name, variant in variants.items():
        other = search.probe(variant, 4096)
        if base is None or other is None or workload.model.is_bare:
            answer[name] = None
            continue
        answer[name] = _bytes(base[1]) != _bytes(other[1])
    return answer


def _bytes(est: MemoryEstimate) -> tuple[int, ...]:
    """The activation and buffer bytes of every phase, on the device and the host: what the long-context settings
    change (the NCCL communicators a layout adds are overhead, modelled apart)."""
    parts = [part for phase in est.phases.values() for part in (phase.gpu, phase.cpu)]
    return tuple(part.get(name, 0) for part in parts for name in ("activations", "buffers"))


__all__ = [
    "SEARCH_CAP",
    "Fits",
    "LongestFit",
    "NextLimit",
    "NoLengthFits",
    "fits_within",
    "longest_fit",
    "modelled",
]
