"""What one rank holds in one phase of a step (:class:`Phase`), by the practitioners' categories (:data:`CATEGORIES`).

Plain data below the estimator's arithmetic: the core fills phases, the allocator's step sequence reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "buffers")


@dataclass
class Phase:
    """Bytes alive in one phase of a step on one rank, by category, split into device (GPU) and host (CPU)."""

    gpu: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    cpu: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

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


__all__ = ["CATEGORIES", "Phase"]
