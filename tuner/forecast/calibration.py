"""The safety margin between the estimate and a device's memory, learned from measured runs (pure Python).

A config fits when ``estimated peak × (1 + margin) ≤ device memory`` (and the node's CPU holds its share). The margin
starts at :data:`DEFAULT_MARGIN`. Each measured run adds the ratio measured/estimated peak; the margin becomes the
90th percentile of how far measurements exceeded their estimates, plus a small cushion, never below
:data:`MIN_MARGIN`. An out-of-memory run that the estimator let through raises the margin at once, to just what
would have pruned that config. The margin never exceeds :data:`MAX_MARGIN`.

Measured and estimated peaks are compared on like terms (:func:`allocated_part`): a run's peak is what CUDA's
caching allocator handed out (``max_memory_allocated``), so the estimate's side is its tensors and the cuBLAS
workspaces (allocated from the caching allocator), without the terms no allocated byte holds: the CUDA context and
NCCL's buffers (outside the allocator) and the allocator's reserve (reserved, not allocated). Those are compared with
what measures them (:func:`reserved_part` with ``max_memory_reserved``; the context and NCCL with NVML's process
bytes beyond the reserved peak, :func:`outside_part`). Compared with the whole total, a perfect estimate would read
low and sink the margin to its floor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

DEFAULT_MARGIN = 0.05
MIN_MARGIN = 0.02
CUSHION = 0.01
MAX_RATIOS = 200  # the most recent measurements kept per hardware and model family
MAX_MARGIN = 0.5  # past this the estimate is wrong for that config, not imprecise: one outlier must not prune all
ALLOCATED_TERMS = frozenset({"cublas_workspace"})  # device terms the caching allocator hands out (it counts them)
RESERVE_TERM = "allocator_reserve"


def allocated_part(total: int, overhead_terms: Mapping[str, int]) -> int:
    """The bytes of an estimate's per-GPU ``total`` that ``max_memory_allocated`` counts: all but the named device
    terms outside the allocator or reserved only (CPU estimates have none: the total itself).

    >>> allocated_part(10_000, {"cuda_context": 500, "nccl_dp": 300, "cublas_workspace": 64, "allocator_reserve": 900})
    8300
    """
    return total - sum(size for name, size in overhead_terms.items() if name not in ALLOCATED_TERMS)


def reserved_part(total: int, overhead_terms: Mapping[str, int]) -> int:
    """The bytes of ``total`` that ``max_memory_reserved`` counts: the allocated part and the allocator's reserve."""
    return allocated_part(total, overhead_terms) + overhead_terms.get(RESERVE_TERM, 0)


def outside_part(total: int, overhead_terms: Mapping[str, int]) -> int:
    """The bytes of ``total`` outside the caching allocator (the context and NCCL's buffers): what NVML's process
    bytes hold beyond ``max_memory_reserved``."""
    return total - reserved_part(total, overhead_terms)


@dataclass(frozen=True)
class Calibration:
    """The margin for one hardware kind and model family, and the evidence behind it."""

    margin: float = DEFAULT_MARGIN
    ratios: tuple[float, ...] = field(default_factory=tuple)
    ooms: int = 0

    def fits(self, estimated_peak: int, capacity: int) -> bool:
        """True when the estimate, inflated by the margin, fits in ``capacity`` bytes."""
        return estimated_peak * (1 + self.margin) <= capacity

    def after_measurement(self, estimated_peak: int, measured_peak: int) -> Calibration:
        """The calibration once a run that fitted has been measured."""
        if estimated_peak <= 0 or measured_peak <= 0:
            return self
        ratios = (*self.ratios, measured_peak / estimated_peak)[-MAX_RATIOS:]
        excess = sorted(ratios)[int(0.9 * (len(ratios) - 1))] - 1
        margin = max(MIN_MARGIN, self.margin if self.ooms else 0.0, excess + CUSHION)
        return replace(self, ratios=ratios, margin=min(MAX_MARGIN, margin))

    def after_oom(self, estimated_peak: int, capacity: int) -> Calibration:
        """The calibration once a config the estimator passed ran out of memory: prune its like from now on."""
        needed = capacity / max(1, estimated_peak) - 1 + CUSHION
        return replace(self, margin=min(MAX_MARGIN, max(self.margin, needed)), ooms=self.ooms + 1)
