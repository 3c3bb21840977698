"""The estimator's view of each parallel layout, one module per layout: the rank's view of the model (what one rank
holds) and the memory and time terms the layout adds.

- ``ulysses``: Ulysses sequence parallelism and ALST's pieces (tiled MLP, tiled loss, checkpoint offload) in the
  activations, and their all-to-all and recompute time;
- ``autotp``: AutoTP's shards (the rank's view) and its all-reduces;
- ``autoep``: AutoEP's local experts (the rank's view), their ZeRO groups, the dispatch buffers and all-to-alls;
- ``zeropp``: ZeRO++ at ZeRO-3: hpZ's secondary partition, qwZ's and qgZ's staging buffers and wire bytes.

The ranks each layout's groups hold are :class:`tuner.workload.Ranks` (``Settings.ranks``). Each module's
:class:`~tuner.estimator.layouts.base.LayoutTerms` is a line in :data:`LAYOUTS`, the workload's registry
(:data:`tuner.workload.layouts.LAYOUTS`) mirrored: the estimate takes the rank's view and adds each layout's terms
through it, for the layouts a trial turns on (:func:`active`).
"""

from __future__ import annotations

import functools

from tuner.estimator.layouts.autoep import AUTOEP
from tuner.estimator.layouts.autotp import AUTOTP
from tuner.estimator.layouts.base import LayoutTerms
from tuner.estimator.layouts.ulysses import ULYSSES
from tuner.estimator.layouts.zeropp import HPZ
from tuner.workload import Ranks

LAYOUTS: tuple[LayoutTerms, ...] = (ULYSSES, AUTOTP, AUTOEP, HPZ)  # in the workload registry's order


@functools.lru_cache(maxsize=1024)
def active(ranks: Ranks) -> tuple[LayoutTerms, ...]:
    """The layouts whose group has more than one rank on a trial's ``ranks``, in :data:`LAYOUTS`' order (one per
    distinct ranks: a grid's configs share a few)."""
    return tuple(layout for layout in LAYOUTS if layout.group(ranks) > 1)


__all__ = ["AUTOEP", "AUTOTP", "HPZ", "LAYOUTS", "ULYSSES", "LayoutTerms", "active"]
