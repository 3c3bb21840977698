"""The caching-allocator simulation against hand-computed cases (PyTorch's CUDACachingAllocator rules)."""

import pytest

from tuner.estimator.runtime.allocator import CachingAllocator, OutOfMemory, round_size, segment_size, simulate

MiB = 2**20


def alloc(name: str, size: int, stream: int = 0) -> tuple:
    return ("alloc", name, size, stream)


def free(name: str) -> tuple:
    return ("free", name, 0)


def test_rounding_and_segment_sizes() -> None:
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1000)] == [512, 512, 512, 512, 1024, 1024]
    assert segment_size(MiB) == 2 * MiB  # the small pool's 2 MiB segments
    assert segment_size(MiB + 512) == 20 * MiB  # 1-10 MiB requests get 20 MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB  # from 10 MiB: rounded up to 2 MiB
    assert segment_size(11 * MiB + 512) == 12 * MiB
    sim = simulate([alloc("a", 1), alloc("b", 513)])
    assert (sim.peak_requested, sim.peak_allocated, sim.peak_reserved) == (514, 1536, 2 * MiB)


def test_small_requests_share_one_small_segment() -> None:
    sim = simulate([alloc(f"t{i}", 100) for i in range(4)])
    assert (sim.peak_allocated, sim.peak_reserved, sim.segments) == (2048, 2 * MiB, 1)


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left() -> None:
    # 11.5 MiB takes a 12 MiB segment; the 0.5 MiB left is not split off, so the block counts 12 MiB allocated
    sim = simulate([alloc("a", 11 * MiB + MiB // 2)])
    assert (sim.peak_allocated, sim.peak_reserved) == (12 * MiB, 12 * MiB)
    # 6 MiB in a 20 MiB segment leaves 14 MiB, split off and reused by the next two 6 MiB requests
    sim = simulate([alloc("a", 6 * MiB), alloc("b", 6 * MiB), alloc("c", 6 * MiB)])
    assert (sim.peak_allocated, sim.peak_reserved, sim.segments) == (18 * MiB, 20 * MiB, 1)
    sim = simulate([alloc("a", 6 * MiB), alloc("b", 6 * MiB), alloc("c", 6 * MiB), alloc("d", 3 * MiB)])
    assert (sim.peak_reserved, sim.segments) == (40 * MiB, 2)  # 2 MiB left in the first: a second segment


def test_freed_blocks_merge_within_a_segment_and_are_reused() -> None:
    sim = simulate([alloc("a", 6 * MiB), alloc("b", 6 * MiB), free("a"), free("b"), alloc("c", 18 * MiB)])
    assert (sim.peak_reserved, sim.segments) == (20 * MiB, 1)  # a, b and the rest merged back into 20 MiB


def test_no_coalescing_across_segments_and_expandable_segments_fix_it() -> None:
    events = [alloc("x", 12 * MiB), alloc("y", 12 * MiB), free("x"), free("y"), alloc("z", 20 * MiB)]
    plain = simulate(events)
    assert (plain.peak_reserved, plain.peak_allocated, plain.reserve) == (44 * MiB, 24 * MiB, 20 * MiB)
    # one growing segment: x maps a 20 MiB page, y extends the free 8 MiB tail by one more page; freed, x and y
    # and the tail merge into 40 MiB, which holds z
    grown = simulate(events, expandable_segments=True)
    assert (grown.peak_reserved, grown.peak_allocated, grown.segments) == (40 * MiB, 24 * MiB, 2)


def test_best_fit_picks_the_smallest_free_block() -> None:
    allocator = CachingAllocator()
    for name, size in (("big", 30 * MiB), ("small", 12 * MiB)):
        allocator.malloc(name, size)
    allocator.free("big")
    allocator.free("small")
    allocator.malloc("new", 12 * MiB)  # fits the freed 12 MiB segment exactly, not the older 30 MiB one
    assert allocator.reserved == 42 * MiB
    allocator.malloc("next", 29 * MiB)  # the 30 MiB block is still whole
    assert (allocator.reserved, allocator.allocated) == (42 * MiB, 42 * MiB)  # 29 MiB left 1 MiB: not split


def test_freed_blocks_are_reused_only_on_their_stream() -> None:
    same = simulate([alloc("a", 12 * MiB), free("a"), alloc("b", 12 * MiB)])
    other = simulate([alloc("a", 12 * MiB), free("a"), alloc("b", 12 * MiB, stream=1)])
    assert (same.peak_reserved, other.peak_reserved) == (12 * MiB, 24 * MiB)


def test_a_capacity_releases_free_segments_before_failing() -> None:
    events = [alloc("x", 12 * MiB), free("x"), alloc("z", 20 * MiB)]
    sim = simulate(events, capacity=30 * MiB)
    assert (sim.peak_reserved, sim.releases) == (20 * MiB, 1)  # x's cached segment went back first
    with pytest.raises(OutOfMemory):
        simulate([alloc("x", 12 * MiB), alloc("z", 20 * MiB)], capacity=30 * MiB)


def test_expandable_segments_unmap_the_free_tail_under_pressure() -> None:
    # stream 1's segment maps a 20 MiB page for a, which is freed; stream 0's z needs two pages: 60 MiB > 50, so
    # stream 1's free page is unmapped first and z fits (without the release: out of memory)
    events = [alloc("a", 12 * MiB, stream=1), free("a"), alloc("z", 30 * MiB)]
    sim = simulate(events, expandable_segments=True, capacity=50 * MiB)
    assert (sim.releases, sim.peak_reserved, sim.peak_allocated) == (1, 40 * MiB, 30 * MiB)
    with pytest.raises(OutOfMemory):
        simulate([alloc("a", 12 * MiB, stream=1), alloc("z", 30 * MiB)], expandable_segments=True, capacity=50 * MiB)


def test_a_tensor_is_allocated_once() -> None:
    allocator = CachingAllocator()
    allocator.malloc("a", 1)
    with pytest.raises(ValueError, match="already allocated"):
        allocator.malloc("a", 1)


def test_a_released_segments_id_never_names_a_new_segment() -> None:
    """Under a capacity the cache is released (whole free segments) and new segments follow; a new segment that
    reused a released one's id collided with a live segment's blocks (found by the warm-start property test)."""
    mib = 2**20
    allocator = CachingAllocator(capacity=95 * mib)
    for name, size in (("a", 30), ("b", 20), ("c", 30)):
        allocator.malloc(name, size * mib)
    allocator.free("b")  # its whole segment is cached, free
    allocator.malloc("d", 30 * mib)  # 110 MiB > 95: b's segment is released, d gets a new one
    assert allocator.stats.releases == 1 and allocator.reserved == 90 * mib
    allocator.free("c")
    allocator.free("d")
    allocator.malloc("e", 30 * mib)  # both cached 30 MiB segments are reused, nothing new reserved
    allocator.malloc("f", 30 * mib)
    assert allocator.reserved == 90 * mib and allocator.allocated == 90 * mib
    for name in ("a", "e", "f"):
        allocator.free(name)
    assert allocator.allocated == 0


def test_expandable_segments_unmap_free_pages_inside_a_segment_and_map_them_again() -> None:
    """PyTorch's ``release_blocks`` unmaps the whole pages of every free block of an expandable segment, holes
    inside included, and ``find_expandable_block`` maps pages at the lowest address where free and unmapped space
    fit a request: a hole is released under pressure and used again."""
    allocator = CachingAllocator(expandable_segments=True, capacity=100 * MiB)
    for name in "abc":  # one 20 MiB page each: [0, 20), [20, 40), [40, 60)
        allocator.malloc(name, 20 * MiB)
    allocator.free("b")  # a free page inside the segment, between a and c
    allocator.malloc("d", 60 * MiB)  # 60 + 60 > 100: b's page is unmapped, d maps three pages after c
    assert (allocator.stats.releases, allocator.reserved, allocator.allocated) == (1, 100 * MiB, 100 * MiB)
    allocator.free("a")
    allocator.free("c")  # free mapped [0, 20), unmapped [20, 40), free mapped [40, 60)
    allocator.malloc("e", 30 * MiB)  # a page more would be 120: a's and c's pages go too, e maps two at 0
    assert (allocator.stats.releases, allocator.reserved, allocator.allocated) == (2, 100 * MiB, 90 * MiB)
    block = allocator._live["e"][0]
    assert (block.start, block.size, block.next is not None and block.next.size) == (0, 30 * MiB, 10 * MiB)
    allocator.free("d")
    allocator.malloc("f", 60 * MiB)  # d's pages are mapped and free: reused, nothing more is mapped
    assert allocator.reserved == 100 * MiB and allocator.stats.peak_reserved == 100 * MiB
