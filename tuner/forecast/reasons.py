"""Why a config was pruned, for people: a structured reason, a sentence with human sizes, and a key by kind (pure).

The loop stores :meth:`PruneReason.sentence` as the trial's reason; the CLI and the dashboard group stored reasons by
:func:`reason_key` (memory · phase · largest category). Reasons stored before this module existed (raw bytes, or
their number-free templates from the store's summary) still get a key, and :func:`describe_reason` rewrites their
byte counts as human sizes.

Example:
    >>> reason = PruneReason("gpu", "backward", "buffers", 2**30, needed=2117110284, available=64 * 2**20, margin=0.05)
    >>> reason.sentence()
    'needs 1.97 GiB of 64.0 MiB GPU memory at the backward phase (5% margin included); largest: buffers 1.00 GiB'
    >>> reason.key()
    'GPU memory · backward · buffers'
    >>> reason_key("gpu: estimated peak N B × (N + margin N) exceeds N B by N B at the backward phase; "
    ...            "largest category buffers")
    'GPU memory · backward · buffers'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tuner.estimator import CATEGORIES, CPU_VIEWS, PHASES, MemoryEstimate
from tuner.forecast.calibration import Calibration
from tuner.storage import reason_kind
from tuner.units import format_bytes

MEMORY_LABELS = {"gpu": "GPU memory", "cpu": "node CPU memory"}
SEPARATOR = " · "
_BYTES = re.compile(r"\b(\d+) (?:B|bytes)\b")
# Reasons written before this module, raw or with their numbers replaced by N (the store's summary).
_OLD_LOOP = re.compile(r"^gpu: estimated peak .*? at the (\w+) phase; largest category (\w+)")
_OLD_GPU = re.compile(r"^GPU memory short by .*? at the (\w+) phase(?: \(largest category: (\w+)\))?")
_OLD_CPU = re.compile(r"^CPU memory per node short by [^(]*(?:\(largest: (\w+)\))?")
_NEW_MEMORY = re.compile(r"^needs .+? of .+? (GPU memory|node CPU memory)\b")
_NEW_PHASE = re.compile(r" at the (\w+) phase\b")
_NEW_LARGEST = re.compile(r"; largest: ([a-z ]+?) (?:[\d.]+|N)\b")


@dataclass(frozen=True)
class PruneReason:
    """Why a config cannot fit: which memory, in which phase, the largest category, needed and available bytes.

    ``needed`` includes the safety margin (``needed = estimate × (1 + margin)``); ``phase`` is None when the memory
    that overflows is not held by a phase of the step (the node's rank processes or model loading).
    """

    memory: str  # "gpu" or "cpu" (per node)
    phase: str | None
    largest: str | None
    largest_bytes: int | None
    needed: int
    available: int
    margin: float = 0.0

    @property
    def short(self) -> int:
        """Bytes missing."""
        return self.needed - self.available

    def sentence(self) -> str:
        """``needs 1.97 GiB of 64.0 MiB GPU memory at the backward phase; largest: buffers 1.00 GiB``."""
        text = f"needs {format_bytes(self.needed)} of {format_bytes(self.available)} {MEMORY_LABELS[self.memory]}"
        if self.phase:
            text += f" at the {self.phase} phase"
        if self.margin:
            text += f" ({self.margin * 100:.3g}% margin included)"
        if self.largest:
            text += f"; largest: {_category(self.largest)}"
            if self.largest_bytes is not None:
                text += f" {format_bytes(self.largest_bytes)}"
        return text

    def key(self) -> str:
        """The kind of reason, for grouping: ``GPU memory · backward · buffers``."""
        parts = [MEMORY_LABELS[self.memory], self.phase, _category(self.largest) if self.largest else None]
        return SEPARATOR.join(part for part in parts if part)


def memory_reason(est: MemoryEstimate, calibration: Calibration) -> PruneReason | None:
    """Why ``est`` does not fit (the GPU with the calibrated margin, then the node's CPU), or None when it fits."""
    peak = est.per_gpu["total"] or 0
    if not calibration.fits(peak, est.gpu_memory):
        largest = max(CATEGORIES, key=lambda name: est.per_gpu[name] or 0)
        return PruneReason(
            memory="gpu",
            phase=est.peak_phase,
            largest=largest,
            largest_bytes=est.per_gpu[largest] or 0,
            needed=int(peak * (1 + calibration.margin)),
            available=est.gpu_memory,
            margin=calibration.margin,
        )
    if est.cpu_headroom < 0:
        held = {name: size for name, size in est.cpu_per_node.items() if name not in CPU_VIEWS}
        largest = max(held, key=held.__getitem__)
        host = {name: est.phases[name].cpu_total for name in PHASES if name in est.phases}
        phase = max(host, key=host.__getitem__) if any(host.values()) and largest in CATEGORIES else None
        return PruneReason(
            memory="cpu",
            phase=phase,
            largest=largest,
            largest_bytes=held[largest],
            needed=est.cpu_per_node["total"],
            available=est.cpu_memory,
        )
    return None


def reason_key(reason: str | None) -> str:
    """The kind of a stored reason (new sentence, older raw-byte text, or either's ``N`` template).

    Memory reasons group as ``memory · phase · largest category``; others (the search space's) by their text with
    what they measured replaced by ``N`` (:func:`tuner.storage.reason_kind`: a condition's operands stay).

    Example:
        >>> reason_key("needs 2.10 GiB of 1.00 GiB node CPU memory at the step phase; "
        ...            "largest: optimizer states 1.50 GiB")
        'node CPU memory · step · optimizer states'
        >>> reason_key("GPU memory short by 1234567 bytes at the forward phase")
        'GPU memory · forward'
        >>> reason_key("tensor_parallel is pinned to 2, which applies only when gpus_per_node >= 2 (gpus_per_node = 1)")
        'tensor_parallel is pinned to 2, which applies only when gpus_per_node >= 2 (gpus_per_node = 1)'
    """
    if not reason:
        return "(no reason)"
    found = _NEW_MEMORY.match(reason)
    if found:
        phase, largest = _NEW_PHASE.search(reason), _NEW_LARGEST.search(reason)
        return _key(found.group(1), phase and phase.group(1), largest and largest.group(1))
    found = _OLD_LOOP.match(reason)
    if found:
        return _key(MEMORY_LABELS["gpu"], found.group(1), found.group(2))
    found = _OLD_GPU.match(reason)
    if found:
        return _key(MEMORY_LABELS["gpu"], found.group(1), found.group(2))
    found = _OLD_CPU.match(reason)
    if found:
        return _key(MEMORY_LABELS["cpu"], None, found.group(1))
    return reason_kind(reason)


def describe_reason(reason: str | None) -> str:
    """A stored reason for people: byte counts of older reasons (``2117110284 B``) become sizes (``1.97 GiB``).

    Example:
        >>> describe_reason("GPU memory short by 1234567 bytes at the backward phase")
        'GPU memory short by 1.2 MiB at the backward phase'
    """
    return _BYTES.sub(lambda found: format_bytes(int(found.group(1))), reason or "")


@dataclass(frozen=True)
class ReasonGroup:
    """Pruned trials of one kind: how many, and one of their reasons as an example."""

    key: str
    count: int
    example: str


def group_reasons(reasons: Iterable[str | None]) -> list[ReasonGroup]:
    """Reasons grouped by :func:`reason_key`, most frequent first (ties by key); each keeps its first reason.

    Example:
        >>> [(g.key, g.count) for g in group_reasons(["GPU memory short by 1 bytes at the step phase", None,
        ...                                            "GPU memory short by 2 bytes at the step phase"])]
        [('GPU memory · step', 2), ('(no reason)', 1)]
    """
    counts: dict[str, int] = {}
    examples: dict[str, str] = {}
    for reason in reasons:
        key = reason_key(reason)
        counts[key] = counts.get(key, 0) + 1
        examples.setdefault(key, describe_reason(reason) if reason else key)
    ordered = sorted(counts, key=lambda key: (-counts[key], key))
    return [ReasonGroup(key, counts[key], examples[key]) for key in ordered]


def group_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """A histogram of reasons (the store's summary) regrouped by :func:`reason_key`, most frequent first.

    Example:
        >>> group_counts({"GPU memory short by N bytes at the backward phase (largest category: buffers)": 2,
        ...               "needs N GiB of N MiB GPU memory at the backward phase; largest: buffers N GiB": 3})
        {'GPU memory · backward · buffers': 5}
    """
    grouped: dict[str, int] = {}
    for reason, count in counts.items():
        key = reason_key(reason)
        grouped[key] = grouped.get(key, 0) + count
    return dict(sorted(grouped.items(), key=lambda item: (-item[1], item[0])))


def _category(name: str) -> str:
    return name.replace("_", " ")


def _key(memory: str, phase: str | None, largest: str | None) -> str:
    return SEPARATOR.join(part for part in (memory, phase, _category(largest) if largest else None) if part)
