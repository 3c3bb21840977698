"""ZeRO-1/2's worst-rank gradient span, computed from the parameters, equals the per-rank loop it replaced."""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate

import pytest

from tuner.estimator.states.partitions import NCCL_START_ALIGNMENT, flat_partition, round_robin_order, worst_rank_span


def per_rank_span(numels: tuple[int, ...], partition: int, world_size: int) -> int:
    """The reference: every rank's span of overlapping parameters, one rank at a time (the estimator until now)."""
    ends = list(accumulate(numels))
    starts = [end - numel for end, numel in zip(ends, numels, strict=True)]
    worst = 0
    for rank in range(world_size):
        lo, hi = rank * partition, (rank + 1) * partition
        first = bisect_right(ends, lo)
        last = bisect_right(starts, hi - 1) - 1
        if first <= last:
            worst = max(worst, ends[last] - starts[first])
    return worst


def random_numels(rng: random.Random) -> tuple[int, ...]:
    """Parameter sizes of many shapes: tiny norms, huge embeddings, repeated layers, the odd empty tensor."""
    kind = rng.randrange(4)
    count = rng.randint(1, 60)
    if kind == 0:  # small sizes: many parameters per partition, boundaries everywhere
        return tuple(rng.randint(1, 50) for _ in range(count))
    if kind == 1:  # spread over orders of magnitude, like a transformer's norms, projections and embeddings
        return tuple(int(10 ** rng.uniform(0, 7)) for _ in range(count))
    if kind == 2:  # a repeated layer block between an embedding and a head
        block = [rng.randint(1, 5000) for _ in range(rng.randint(1, 6))]
        return (rng.randint(1, 10**6), *block * rng.randint(1, 20), rng.randint(1, 10**6))
    return tuple(rng.choice((0, 1, rng.randint(1, 10**4))) for _ in range(count))


def test_matches_the_per_rank_loop_over_random_sizes_worlds_and_alignments() -> None:
    rng = random.Random(20240519)
    worlds = [1, 2, 3, 7, 8, 16, 64, 512, 1000, 4096]
    for case in range(1500):
        numels = random_numels(rng)
        world = worlds[case % len(worlds)] if case % 3 else rng.randint(1, 4096)
        factor = rng.choice((1, NCCL_START_ALIGNMENT, 3, 8, 64, 1024))  # alignment = factor × world
        total = sum(numels)
        partition = -(-total // (factor * world)) * factor
        expected = per_rank_span(numels, partition, world)
        assert worst_rank_span(numels, partition, world) == expected, (numels, world, factor)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 513, 4096])
def test_flat_partition_matches_the_per_rank_loop(world: int) -> None:
    rng = random.Random(world)
    for _ in range(60):
        numels = random_numels(rng)
        for order in (numels, round_robin_order(numels, world)):
            flat = flat_partition(order, world)
            assert flat.padded_total % (NCCL_START_ALIGNMENT * world) == 0
            assert flat.partition * world == flat.padded_total
            reference = sum(order) if world == 1 else per_rank_span(order, flat.partition, world)
            assert flat.worst_rank_grads == reference


def test_partitions_smaller_than_the_buffer_leave_the_tail_uncounted() -> None:
    """A partition too small to cover the buffer still matches the loop (ranks past ``world_size`` do not exist)."""
    numels = (5, 100, 7, 3000, 9)
    for partition in range(1, 40):
        for world in (1, 2, 5, 30):
            assert worst_rank_span(numels, partition, world) == per_rank_span(numels, partition, world)


def test_round_robin_order_ignores_buckets_past_the_last_parameter() -> None:
    numels = (1, 2, 3, 4, 5)
    assert round_robin_order(numels, 4096) == numels
    assert round_robin_order(numels, 2) == (1, 3, 5, 2, 4)
    assert worst_rank_span((), 0, 8) == 0
