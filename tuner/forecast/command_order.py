"""The first configs of a study of a training command's own model (no ``--model``: nothing to estimate or predict
with): at each ZeRO stage the space offers, the largest micro-batch it allows, from the stage that needs the least
memory (the highest) to the one that needs the most.

The largest micro-batch first is the rule DeepSpeed's autotuner starts from too (its fast mode: the largest
micro-batch that fits, per stage): more samples per step spread each step's fixed costs (the optimizer step, the
collectives' latency, the launch of each kernel) over more samples, so it is the likely winner of its stage. The
least memory first makes each run teach the most: one that runs out of memory rules out, before they run, that
micro-batch at every stage after it (they need at least as much: :mod:`tuner.study.memory_bound`), and once one has
run the slower ones after it are stopped early against it. The sampler goes on from there.
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
    """The params to enqueue: per ZeRO stage of the space's grid, highest first, its largest micro-batch (the other
    parameters at their defaults); none when the space searches neither."""
    if not any(name in space.searched for name in ORDERED):
        return []
    largest: dict[int, Suggestion] = {}
    for suggestion in grid_suggestions(space, workload, ORDERED, global_batch, nvme_path):
        stage, micro = suggestion.trial.stage, suggestion.trial.batch[0]
        kept = largest.get(stage)
        if kept is None or (isinstance(micro, int) and micro > (kept.trial.batch[0] or 0)):
            largest[stage] = suggestion
    return [enqueue_params(space, largest[stage]) for stage in sorted(largest, reverse=True)]
