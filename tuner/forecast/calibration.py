"""The safety margin between the estimate and a device's memory, learned from measured runs (pure Python).

A config fits when ``estimated peak × (1 + margin) ≤ device memory`` (and the node's CPU holds its share). The margin
starts at :data:`DEFAULT_MARGIN`. Each measured run adds the ratio measured/estimated peak; the margin becomes the
90th percentile of how far measurements exceeded their estimates, plus a small cushion, never below
:data:`MIN_MARGIN`. An out-of-memory run that the estimator let through raises the margin at once, to just what
would have pruned that config. The margin never exceeds :data:`MAX_MARGIN`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DEFAULT_MARGIN = 0.05
MIN_MARGIN = 0.02
CUSHION = 0.01
MAX_RATIOS = 200  # the most recent measurements kept per hardware and model family
MAX_MARGIN = 0.5  # past this the estimate is wrong for that config, not imprecise: one outlier must not prune all


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
