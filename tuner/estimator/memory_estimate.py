"""The estimate's result (:class:`MemoryEstimate`): bytes per GPU at the peak phase, per node's CPU and NVMe, and
the phases and details they come from, with what fits and why not.

``per_gpu`` holds the peak phase's categories (:data:`.CATEGORIES`, activations None when unknown), the device
``overhead`` and the ``total``; ``cpu_per_node`` the worst node's host categories, the ranks' ``processes`` and
``model_load``, and two views that are not categories of their own (:data:`CPU_VIEWS`): the ``total`` and the
``pinned`` (page-locked) bytes, which are part of the total, not added to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.estimator.phases import CATEGORIES, Phase
from tuner.units import format_bytes

CPU_VIEWS = frozenset({"total", "pinned"})  # cpu_per_node entries that are not categories of their own


@dataclass
class MemoryEstimate:
    """The estimate for one workload under one ds_config. All sizes are bytes."""

    n_params: int
    world_size: int
    phases: dict[str, Phase]
    peak_phase: str
    per_gpu: dict[str, int | None]
    cpu_per_node: dict[str, int]
    nvme_per_node: int
    gpu_memory: int
    cpu_memory: int
    details: dict[str, int]
    activations_known: bool
    architecture: str = ""
    activations_source: str = "none"
    overhead_terms: dict[str, int] = field(default_factory=dict)
    trainable_params: int | None = None  # None: every parameter trains (n_params)
    estimate_only: str = ""  # why no run here can check this estimate ("": one can)

    @property
    def gpu_total(self) -> int:
        """Peak device bytes per GPU, overhead included."""
        return int(self.per_gpu["total"] or 0)

    def host_states_per_rank(self, ranks_per_node: int) -> int:
        """One rank's share of what its node's CPU holds for the model: the offloaded parameters, gradients and
        optimizer states and the host buffers (not the processes' own memory nor the model's loading peak). On CPU
        ranks these live in the memory a rank's measured peak counts, beside the device part (``gpu_total``)."""
        host = sum(
            self.cpu_per_node.get(name, 0) for name in ("parameters", "gradients", "optimizer_states", "buffers")
        )
        return host // max(1, ranks_per_node)

    @property
    def headroom(self) -> int:
        """GPU memory left at the peak (negative: does not fit)."""
        return self.gpu_memory - self.gpu_total

    @property
    def cpu_headroom(self) -> int:
        """Host memory left per node at its peak."""
        return self.cpu_memory - self.cpu_per_node["total"]

    @property
    def fits(self) -> bool:
        """True when both the GPU and the node's CPU memory hold the peak."""
        return self.headroom >= 0 and self.cpu_headroom >= 0

    def overflow_reason(self) -> str | None:
        """Why it does not fit: the memory that overflows, by how much, and its largest category."""
        if self.headroom < 0:
            largest = max(CATEGORIES, key=lambda name: self.per_gpu[name] or 0)
            return (
                f"GPU memory short by {format_bytes(-self.headroom)} at the {self.peak_phase} phase "
                f"(largest category: {largest})"
            )
        if self.cpu_headroom < 0:
            largest = max((k for k in self.cpu_per_node if k not in CPU_VIEWS), key=self.cpu_per_node.__getitem__)
            return f"CPU memory per node short by {format_bytes(-self.cpu_headroom)} (largest: {largest})"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The ``dstune estimate --json`` object (its fields: ``docs/commands.md``), plus phases and details."""
        return {
            "n_params": self.n_params,
            "trainable_params": self.n_params if self.trainable_params is None else self.trainable_params,
            "estimate_only": bool(self.estimate_only),
            "estimate_only_why": self.estimate_only or None,
            "architecture": self.architecture,
            "activations_source": self.activations_source,
            "world_size": self.world_size,
            "per_gpu": dict(self.per_gpu),
            "cpu_per_node": dict(self.cpu_per_node),
            "nvme_per_node": self.nvme_per_node,
            "gpu_memory": self.gpu_memory,
            "cpu_memory": self.cpu_memory,
            "fits": self.fits,
            "headroom": self.headroom,
            "cpu_headroom": self.cpu_headroom,
            "peak_phase": self.peak_phase,
            "phases": {name: {"gpu": phase.gpu_total, "cpu": phase.cpu_total} for name, phase in self.phases.items()},
            "details": dict(self.details),
            "overhead_terms": dict(self.overhead_terms),
            "reason": self.overflow_reason(),
        }
