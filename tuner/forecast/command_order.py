"""The first configs of a study of a training command's own model (no ``--model``: nothing to estimate or predict
with): at each ZeRO stage the space offers, the largest micro-batch it allows, stages in the space's order.

The rule DeepSpeed's autotuner starts from too (its fast mode: the largest micro-batch that fits, per stage): more
samples per step spread each step's fixed costs (the optimizer step, the collectives' latency, the launch of each
kernel) over more samples, so the largest micro-batch that fits is the likely winner of its stage. One that runs out
of memory rules out the larger ones of its stage and of the stages that need more (:mod:`tuner.study.memory_bound`),
and the sampler goes on from there.
"""

from __future__ import annotations

from typing import Any

from tuner.forecast.warm_start import enqueue_params, grid_suggestions
from tuner.space import SearchSpace, Suggestion
from tuner.workload import Workload

ORDERED = ("stage", "micro_batch")


def largest_micro_first(
    space: SearchSpace, workload: Workload, global_batch: int | None = None, nvme_path: str | None = None
) -> list[dict[str, Any]]:
    """The params to enqueue: per ZeRO stage of the space's grid (in its order), its largest micro-batch (the
    other parameters at their defaults); none when the space searches neither."""
    if not any(name in space.searched for name in ORDERED):
        return []
    largest: dict[int, Suggestion] = {}
    for suggestion in grid_suggestions(space, workload, ORDERED, global_batch, nvme_path):
        stage, micro = suggestion.trial.stage, suggestion.trial.batch[0]
        kept = largest.get(stage)
        if kept is None or (isinstance(micro, int) and micro > (kept.trial.batch[0] or 0)):
            largest[stage] = suggestion
    return [enqueue_params(space, suggestion) for suggestion in largest.values()]
