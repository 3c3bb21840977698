"""The API's ``considered`` entries of ``/v1/recommend``: the best config of each layout the estimate source judged,
with one degree per layout of the registry (:data:`tuner.workload.layouts.PLAINEST_FIRST`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, create_model

from tuner.workload.layouts import PLAINEST_FIRST

if TYPE_CHECKING:  # one degree per layout of the registry, plainest first (tuner.workload.layouts)
    _LayoutDegrees = BaseModel
else:
    _LayoutDegrees = create_model(
        "_LayoutDegrees",
        __doc__=None,
        __module__=__name__,
        **{kind.field: (int, Field(description=f"{kind.noun} ({kind.key}); 1: off.")) for kind in PLAINEST_FIRST},
    )


class ConsideredLayout(_LayoutDegrees):
    """The best config of one layout (AutoTP degree × hpZ group × Ulysses degree × AutoEP degree) the estimate source
    judged: the fastest predicted that fits with the margin, else the one that misses by the least and why
    (tuner.forecast.layouts)."""

    chosen: bool = Field(description="The recommended config's layout (its entry is the recommended config).")
    fits: bool = Field(description="Whether any config of this layout fits with the calibrated margin.")
    predicted_tokens_per_s: float | None = Field(description="The throughput model's prediction; null: nothing fits.")
    estimated_peak_bytes: int = Field(description="The estimator's peak per GPU of this config.")
    reason: str | None = Field(description="Why it does not fit (the memory, phase and largest category); null: fits.")
    stage: int
    micro_batch: int | None
    grad_accum: int | None = Field(
        description="Accumulation steps: a layout that takes ranks from data parallelism (sp × tp) accumulates over "
        "them, so that every layout is judged at the global batch data parallelism trains at its micro-batch."
    )
    global_batch: int = Field(description="Samples per optimizer step (train_batch_size) of this config.")
    activation_checkpointing: bool
    offload_optimizer: str
    offload_param: str
    configs: int = Field(
        description="Configs of the grid with this layout that were judged at the recommended config's global batch."
    )
    fitting: int = Field(description="Of which fit with the margin.")


__all__ = ["ConsideredLayout"]
