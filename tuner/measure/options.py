"""How a run is measured: one options object with one set of defaults, for ``dstune measure``, ``dstune tune``, the
job queue, the study's dispatcher and the launchers.

Pure data (no torch, no Ray): the study and the job schema read its defaults without importing a launcher.

Example:
    >>> MEASURE_DEFAULTS.warmup, MEASURE_DEFAULTS.steps, MEASURE_DEFAULTS.timeout
    (2, 3, 600.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.measure.script.command import ScriptCommand


@dataclass(frozen=True)
class MeasureOptions:
    """How each run is measured.

    Attributes:
        launcher: ``ray`` (a local Ray, or the cluster at ``ray_address``) or ``local`` (processes on this machine).
        ray_address: An existing Ray cluster; None starts a private local Ray.
        warmup: Optimizer steps run before timing (they build buffers and warm caches).
        steps: Timed optimizer steps.
        timeout: Seconds before every rank of the run is killed (the run is then ``timeout``).
        memory_cap: Address-space cap per rank in bytes (CPU runs), None for none.
        warmup_max: Past ``warmup``, warm up until the last step times settle, up to this many warm-up steps in all.
        script: The user's own training command to measure instead of dstune's trainer
            (:mod:`tuner.measure.backends`); None measures with the built-in trainer.
        seq_len_known: False for a training command without a model nor ``--seq-len``: tokens/s only from the token
            ids its forward saw (samples/s always).
        steps_at_least: A training command that ends by itself after at least this many timed steps (fewer than
            ``steps``) is measured on those (a winner's longer confirmation run); None: it must time all ``steps``.
    """

    launcher: str = "ray"
    ray_address: str | None = None
    warmup: int = 2
    steps: int = 3
    timeout: float = 600.0
    memory_cap: int | None = None
    warmup_max: int | None = None
    script: ScriptCommand | None = None
    seq_len_known: bool = True
    steps_at_least: int | None = None


MEASURE_DEFAULTS = MeasureOptions()

__all__ = ["MEASURE_DEFAULTS", "MeasureOptions"]
