"""How DeepSpeed 0.19 splits parameters across data-parallel ranks (element counts, worst rank).

ZeRO-1/2 flatten all parameters into one buffer padded to a multiple of ``2 × world_size`` and cut it into equal
partitions; a rank's gradient buffer holds every parameter that *overlaps* its partition, whole, so parameters that
straddle a boundary make one rank's gradients larger than ``Ψ/N`` (the ZeRO paper ignores this). ZeRO-3 partitions
each parameter separately, padding each to a multiple of the world size; parameters of at most
``stage3_param_persistence_threshold`` elements also stay whole on every rank.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

NCCL_START_ALIGNMENT = 2  # DeepSpeed's nccl_start_alignment_factor (4 bytes / sizeof(fp16))


@dataclass(frozen=True, slots=True)
class FlatPartition:
    """ZeRO-1/2 sizes in elements: the padded flat buffer, one partition, and the worst rank's gradient buffer; with
    more than one parameter group (Muon's two, AutoEP's expert groups), each group's partition (``partition`` their
    sum), else none."""

    padded_total: int
    partition: int
    worst_rank_grads: int
    groups: tuple[int, ...] = ()

    @property
    def largest_group(self) -> int:
        """Elements of the largest group's partition (the one group's when there is one)."""
        return max(self.groups, default=self.partition)


@lru_cache(maxsize=4096)
def flat_partition(numels: tuple[int, ...], world_size: int) -> FlatPartition:
    """Partition sizes of ZeRO-1/2 for parameters ``numels`` (in model order) over ``world_size`` ranks."""
    total = sum(numels)
    alignment = NCCL_START_ALIGNMENT * world_size
    padded = -(-total // alignment) * alignment
    partition = padded // world_size
    if world_size == 1:
        return FlatPartition(padded, partition, total)
    return FlatPartition(padded, partition, worst_rank_span(numels, partition, world_size))


def worst_rank_span(numels: tuple[int, ...], partition: int, world_size: int) -> int:
    """Elements of the parameters overlapping one rank's ``[r·p, (r+1)·p)`` slice of the flat buffer, worst rank.

    DeepSpeed's ``get_partition_info`` (``stage_1_and_2.py``) gives a rank every parameter that starts in its
    partition or straddles its start. Only ranks in which some parameter starts are examined, so the cost is set by
    the parameters, not by ``world_size``: a rank in which none starts lies inside one parameter ``q`` (or in the
    padding), and the rank where ``q`` starts holds ``q`` whole too, so it is at least as large. Exactly the maximum
    over all ranks (``tests/estimator/test_partitions.py`` checks it against the per-rank loop).

    Example:
        >>> worst_rank_span((10, 1000, 10), 510, 2)
        1010
    """
    if partition <= 0:
        return 0
    ends = list(accumulate(numels))  # end offset of each parameter
    starts = [end - numel for end, numel in zip(ends, numels, strict=True)]
    worst = 0
    for rank in {start // partition for start in starts}:
        if rank >= world_size:
            continue
        lo, hi = rank * partition, (rank + 1) * partition
        first = bisect_right(ends, lo)  # first parameter ending after lo
        last = bisect_right(starts, hi - 1) - 1  # last parameter starting before hi
        if first <= last:
            worst = max(worst, ends[last] - starts[first])
    return worst


@dataclass(frozen=True, slots=True)
class Stage3Partition:
    """ZeRO-3 sizes in elements per rank: shards, whole persistent parameters, and the largest parameter."""

    shard: int
    persistent: int
    largest: int


@lru_cache(maxsize=4096)
def stage3_layout(
    numels: tuple[int, ...],
    world_size: int,
    persistence_threshold: int,
    model_persistence_threshold: int,
    wide: tuple[bool, ...] = (),
    widen: int = 1,
    narrow: tuple[bool, ...] = (),
    narrow_by: int = 1,
) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Each parameter's per-rank ZeRO-3 shard (padded to a multiple of ``world_size``) and whether it also stays whole
    on every rank: at most ``persistence_threshold`` elements, while the persistent ones total at most
    ``model_persistence_threshold``, in model order. The parameters ``wide`` marks are partitioned over
    ``widen × world_size`` ranks (AutoTP's replicated ones at ZeRO-3, :mod:`.layouts.autotp`), those ``narrow``
    marks over ``world_size / narrow_by`` (AutoEP's experts over the expert-data-parallel group,
    :mod:`.layouts.autoep`).

    Example:
        >>> stage3_layout((7, 100, 3), 4, 10, 8)
        ((2, 25, 1), (True, False, False))
        >>> stage3_layout((7, 100, 3), 2, 10, 8, (False, True, False), 2)[0]
        (4, 25, 2)
        >>> stage3_layout((8, 100), 4, 0, 0, narrow=(False, True), narrow_by=2)[0]
        (2, 50)
    """
    parts, persists, persisted = [], [], 0
    for index, numel in enumerate(numels):
        ranks = world_size * widen if wide and wide[index] else world_size
        if narrow and narrow[index]:
            ranks = max(1, world_size // narrow_by)
        parts.append(-(-numel // ranks))
        keep = numel <= persistence_threshold and persisted + numel <= model_persistence_threshold
        persisted += numel if keep else 0
        persists.append(keep)
    return tuple(parts), tuple(persists)


def stage3_partition(
    numels: tuple[int, ...],
    world_size: int,
    persistence_threshold: int,
    model_persistence_threshold: int,
    wide: tuple[bool, ...] = (),
    widen: int = 1,
    narrow: tuple[bool, ...] = (),
    narrow_by: int = 1,
) -> Stage3Partition:
    """Per-rank ZeRO-3 sizes for parameters ``numels`` over ``world_size`` ranks (:func:`stage3_layout`)."""
    thresholds = (persistence_threshold, model_persistence_threshold)
    parts, persists = stage3_layout(numels, world_size, *thresholds, wide, widen, narrow, narrow_by)
    persistent = sum(numel for numel, keep in zip(numels, persists, strict=True) if keep)
    return Stage3Partition(sum(parts), persistent, max(numels))


@lru_cache(maxsize=1024)
def round_robin_order(numels: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    """Parameters in the order ZeRO-1/2 flattens them with ``round_robin_gradients``.

    DeepSpeed's ``_round_robin_reorder`` (``stage_1_and_2.py:901``) deals parameter ``i`` to bucket ``i % N`` and
    concatenates the buckets, so consecutive gradients reduce into different ranks' partitions. The buffer's size is
    unchanged; which parameters straddle a partition boundary (and so the worst rank's gradient buffer) may change.

    Example:
        >>> round_robin_order((1, 2, 3, 4, 5), 2)
        (1, 3, 5, 2, 4)
    """
    buckets = min(world_size, len(numels))  # buckets past the last parameter are empty
    return tuple(numels[i] for start in range(buckets) for i in range(start, len(numels), world_size))
