"""What one rank holds in one phase of a step (:class:`Phase`), by the practitioners' categories (:data:`CATEGORIES`).

Peak memory is the maximum over the phases of a step (:data:`PHASES`), each a sum of what is alive then: ``forward``
(after the forward pass), ``backward`` (all gradients and the reduce buckets), ``step`` (fp32 gradients) and, where
the estimate has it, ``save`` (ZeRO-3 gathering the 16-bit model to save it). Bytes allocated for a moment inside a
phase (:mod:`.transients`) count at their worst moment in it (:func:`.terms.transient`).

Plain data below the estimator's arithmetic: the terms' contributions are combined into phases in one place
(:class:`.terms.Ledger`), the allocator's step sequence reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
PHASES = ("forward", "backward", "step", "save")  # "save" only where the estimate has it (ZeRO-3, gather on save)
STEP_PHASES = PHASES[:3]
_NOTHING = dict.fromkeys(CATEGORIES, 0)  # copied for each phase (a bound ``copy`` builds it fastest)


@dataclass
class Phase:
    """Bytes alive in one phase of a step on one rank, by category, split into device (GPU) and host (CPU)."""

    gpu: dict[str, int] = field(default_factory=_NOTHING.copy)
    cpu: dict[str, int] = field(default_factory=_NOTHING.copy)

    @property
    def gpu_total(self) -> int:
        """Device bytes in this phase."""
        return sum(self.gpu.values())

    @property
    def cpu_total(self) -> int:
        """Host bytes of one rank in this phase."""
        return sum(self.cpu.values())

    def by_category(self) -> dict[str, int]:
        """Device + host bytes per category (what a CPU-only run holds in one process)."""
        return {name: self.gpu[name] + self.cpu[name] for name in CATEGORIES}


__all__ = ["CATEGORIES", "PHASES", "STEP_PHASES", "Phase"]
