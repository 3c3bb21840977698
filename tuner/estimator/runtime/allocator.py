"""A simulation of PyTorch's CUDA caching allocator: what it *reserves* from the device for a sequence of tensor
allocations and frees, against what the tensors *allocate* (pure Python, no torch).

Simulated, as ``c10/cuda/CUDACachingAllocator.cpp`` does it (PyTorch 2.x, default settings, constants named below):

* Every request is rounded up to a multiple of 512 B (``kMinBlockSize``); ``memory_allocated`` counts the rounded
  sizes, so :attr:`Simulation.peak_allocated` is what ``torch.cuda.max_memory_allocated`` would report.
* Requests up to 1 MiB (``kSmallSize``) come from the small pool, whose segments are 2 MiB (``kSmallBuffer``); larger
  ones from the large pool: a request under 10 MiB (``kMinLargeAlloc``) gets a 20 MiB segment (``kLargeBuffer``),
  a larger one a segment of its own size rounded up to 2 MiB (``kRoundLarge``).
* A request takes the smallest cached free block of its pool and stream that fits (best fit, ties by segment and
  address), and splits it when the rest is worth keeping: at least 512 B in the small pool, more than 1 MiB in the
  large pool. Only when no cached block fits is a new segment reserved (``cudaMalloc``).
* A freed block merges with free neighbours *in its own segment*; free blocks of different segments never merge,
  which is where fragmentation comes from. Segments stay reserved when they become free (until ``empty_cache``).
* Freed blocks are reused only by requests on the same stream (events carry a stream, default 0).
* With a ``capacity``, a reservation that would exceed it first releases every wholly free segment (what the
  allocator does before raising an out-of-memory error), then fails if it still does not fit.
* ``expandable_segments=True`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): each (pool, stream) gets one
  segment, a virtual address range backed by pages of 20 MiB (large pool) or 2 MiB (small pool) mapped on demand.
  A request no free block fits maps pages at the lowest address where free and unmapped blocks together fit it
  (``find_expandable_block``): normally the segment's end, so holes between segments disappear; holes inside the
  one segment remain. Under ``capacity`` pressure, the whole pages of every free block are unmapped, holes inside
  the segment as well as its free end (``release_blocks``, ``unmap_block``); a later request that uses an unmapped
  range maps its pages again (``map_block``).

Not simulated: ``max_split_size_mb``, ``roundup_power2_divisions`` and ``garbage_collection_threshold`` (defaults
assumed), CUDA graphs' private pools, events that delay reuse across streams (a cross-stream free is taken as
immediately reusable on its own stream), and two rules of expandable segments: a large block splits for any rest
of 512 B or more there (here, as without them, only for more than 1 MiB), and best fit counts a free block's
unmapped successor as room it could grow into. The sequence of requests is an input: :mod:`.alloc_sequence`
builds a plausible one from an estimate, which is an assumption of its own.

Example:
    >>> sim = simulate([("alloc", "a", 600), ("alloc", "b", 3 * 2**20), ("free", "a", 0)])
    >>> sim.peak_allocated, sim.peak_reserved // 2**20
    (3146752, 22)
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 2**20  # kSmallSize: largest request served by the small pool
SMALL_BUFFER = 2 * 2**20  # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC = 10 * 2**20  # kMinLargeAlloc: requests below this get a kLargeBuffer segment
LARGE_BUFFER = 20 * 2**20  # kLargeBuffer: segment for 1-10 MiB requests; expandable segments' large page
ROUND_LARGE = 2 * 2**20  # kRoundLarge: larger segments are rounded up to this
ADDRESS_SPACE = 2**50  # an expandable segment's virtual address range (PyTorch: 9/8 of the device's memory)

Event = tuple[str, str, int]  # ("alloc", name, bytes) or ("free", name, ignored); an optional 4th item: stream


class OutOfMemory(Exception):
    """The simulated device had no room for a reservation, even after releasing the cache."""


def round_size(size: int) -> int:
    """A request rounded as the allocator rounds it (multiples of 512 B, at least 512 B).

    Example:
        >>> round_size(1), round_size(512), round_size(513)
        (512, 512, 1024)
    """
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment reserved for a rounded request that no cached block fits (``get_allocation_size``).

    Example:
        >>> [segment_size(s) // 2**20 for s in (512, 2**20, 2**20 + 512, 10 * 2**20, 11 * 2**20 + 1)]
        [2, 2, 20, 10, 12]
    """
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False, slots=True)
class _Block:
    segment: int
    start: int
    size: int
    allocated: bool = False
    mapped: bool = True  # False: an expandable segment's address range with no pages behind it
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.start)


@dataclass
class _Pool:
    """Free blocks of one (pool, stream), sorted for best fit."""

    small: bool
    free: list[tuple[int, int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int, int], _Block] = field(default_factory=dict)
    unmapped: list[_Block] = field(default_factory=list)  # expandable: unmapped blocks by address, tail last

    def add(self, block: _Block) -> None:
        key = (block.size, block.segment, block.start)
        bisect.insort(self.free, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.segment, block.start)
        del self.free[bisect.bisect_left(self.free, key)]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self.free, (size, -1, -1))
        return self.blocks[self.free[index]] if index < len(self.free) else None

    def add_unmapped(self, block: _Block) -> None:
        bisect.insort(self.unmapped, block, key=lambda b: (b.segment, b.start))

    def replace_unmapped(self, old: _Block, new: _Block | None) -> None:
        """``old`` (unmapped) leaves; ``new``, what is left unmapped of its range, takes its place in address order."""
        index = self.unmapped.index(old)
        if new is None:
            del self.unmapped[index]
        else:
            self.unmapped[index] = new


def _merge(pool: _Pool, block: _Block) -> _Block:
    """``block`` merged with its free neighbours of the same mapping (taken out of ``pool``): the merged block."""
    for neighbour in (block.prev, block.next):
        if neighbour is None or neighbour.allocated or neighbour.mapped != block.mapped:
            continue
        if neighbour.mapped:
            pool.remove(neighbour)
        else:
            pool.unmapped.remove(neighbour)
        if neighbour is block.prev:
            neighbour.size += block.size
            neighbour.next = block.next
            if block.next is not None:
                block.next.prev = neighbour
            block = neighbour
        else:
            block.size += neighbour.size
            block.next = neighbour.next
            if neighbour.next is not None:
                neighbour.next.prev = block
    return block


@dataclass
class Simulation:
    """What one sequence did to the simulated allocator. All sizes are bytes."""

    peak_requested: int = 0  # live bytes as the tensors asked for them
    peak_allocated: int = 0  # live bytes rounded to blocks (torch.cuda.max_memory_allocated)
    peak_reserved: int = 0  # bytes held from the device (torch.cuda.max_memory_reserved)
    segments: int = 0  # reservations made (cudaMalloc calls, or page-map calls with expandable segments)
    releases: int = 0  # times the cache was released to make room under ``capacity``

    @property
    def reserve(self) -> int:
        """Reserved beyond allocated at their peaks: the allocator's own cost (rounding, splitting, holes)."""
        return self.peak_reserved - self.peak_allocated

    @property
    def ratio(self) -> float:
        """Peak reserved over peak allocated (1.0 for an empty sequence)."""
        return self.peak_reserved / self.peak_allocated if self.peak_allocated else 1.0


class CachingAllocator:
    """The simulated allocator (see the module docstring for what is simulated and what is not).

    Example:
        >>> allocator = CachingAllocator()
        >>> allocator.malloc("x", 25 * 2**20); allocator.free("x"); allocator.malloc("y", 5 * 2**20)
        >>> allocator.reserved // 2**20, allocator.allocated // 2**20
        (26, 5)
    """

    def __init__(self, expandable_segments: bool = False, capacity: int | None = None) -> None:
        self.expandable = expandable_segments
        self.capacity = capacity
        self.allocated = 0
        self.requested = 0
        self.reserved = 0
        self.stats = Simulation()
        self._pools: dict[tuple[bool, int], _Pool] = {}
        self._live: dict[str, tuple[_Block, int, tuple[bool, int]]] = {}
        self._segments: dict[int, int] = {}  # segment id -> bytes (not expandable: whole segments)
        self._segment_ids = itertools.count()  # never reused: a released segment's id must not name a new one

    def malloc(self, name: str, size: int, stream: int = 0) -> None:
        """Allocate ``size`` bytes for tensor ``name`` on ``stream``."""
        if name in self._live:
            raise ValueError(f"{name!r} is already allocated")
        rounded = MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK  # round_size, inlined
        key = (rounded <= SMALL_SIZE, stream)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(small=key[0])
        block = pool.best_fit(rounded)
        if block is None:
            block = self._grow(pool, rounded)
        else:
            pool.remove(block)
        self._split(pool, block, rounded)
        block.allocated = True
        self._live[name] = (block, size, key)
        self.allocated += block.size
        self.requested += size
        stats = self.stats
        if self.allocated > stats.peak_allocated:
            stats.peak_allocated = self.allocated
        if self.requested > stats.peak_requested:
            stats.peak_requested = self.requested

    def free(self, name: str) -> None:
        """Free tensor ``name``: its block returns to its pool, merged with free neighbours of its segment."""
        block, size, key = self._live.pop(name)
        pool = self._pools[key]
        self.allocated -= block.size
        self.requested -= size
        block.allocated = False
        pool.add(_merge(pool, block))

    def _split(self, pool: _Pool, block: _Block, size: int) -> None:
        rest = block.size - size
        if rest >= MIN_BLOCK if pool.small else rest > SMALL_SIZE:
            remainder = _Block(block.segment, block.start + size, rest, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = remainder
            block.next = remainder
            block.size = size
            pool.add(remainder)

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.stats.segments += 1
        self.stats.peak_reserved = max(self.stats.peak_reserved, self.reserved)

    def _grow(self, pool: _Pool, size: int) -> _Block:
        """Room for ``size`` that no cached block has: a new segment, or, expandable, pages mapped where free and
        unmapped space fit it (releasing the cache once under ``capacity``, as PyTorch does before failing)."""
        nbytes = segment_size(size)
        for attempt in range(2):
            if self.expandable:
                block = self._map_chain(pool, self._expandable_block(pool, size), size)
                if block is not None:
                    return block
            elif self._fits(nbytes):
                self._reserve(nbytes)
                segment = next(self._segment_ids)
                self._segments[segment] = nbytes
                return _Block(segment, 0, nbytes)
            if attempt == 0:
                self._release()
        raise OutOfMemory(f"{size} more bytes with {self.reserved} reserved of {self.capacity}")

    def _expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``find_expandable_block``: the lowest address where free and unmapped blocks together hold ``size``
        (an unmapped block, or the free block just before it); the segment's unmapped tail always does."""
        if not pool.unmapped:
            pool.add_unmapped(_Block(next(self._segment_ids), 0, ADDRESS_SPACE, mapped=False))
        for hole in pool.unmapped:
            first = hole.prev if hole.prev is not None and not hole.prev.allocated else hole
            block: _Block | None = first
            room = 0
            while room < size and block is not None and not block.allocated:
                room += block.size
                block = block.next
            if room >= size:
                return first
        raise AssertionError("the unmapped tail of an expandable segment always fits")  # pragma: no cover

    def _map_chain(self, pool: _Pool, block: _Block | None, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages from ``block`` on until one free block holds ``size``
        (``None`` when a mapping does not fit under ``capacity``)."""
        if block is not None and not block.mapped:
            block = self._map(pool, block, min(block.size, size))
        while block is not None and block.size < size:
            assert block.next is not None  # free blocks merge: a free block's free successor is unmapped
            block = self._map(pool, block.next, min(size - block.size, block.next.size))
        if block is not None:
            pool.remove(block)
        return block

    def _map(self, pool: _Pool, hole: _Block, size: int) -> _Block | None:
        """``map_block``: back the first whole pages covering ``size`` bytes of unmapped ``hole``; the mapped part
        merges with free neighbours and joins the pool."""
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        nbytes = min(-(-size // page) * page, hole.size)
        if not self._fits(nbytes):
            return None
        self._reserve(nbytes)
        hole.mapped = True
        rest = None
        if nbytes < hole.size:
            rest = _Block(hole.segment, hole.start + nbytes, hole.size - nbytes, mapped=False, prev=hole)
            rest.next = hole.next
            if hole.next is not None:
                hole.next.prev = rest
            hole.next = rest
            hole.size = nbytes
        pool.replace_unmapped(hole, rest)
        block = _merge(pool, hole)
        pool.add(block)
        return block

    def _release(self) -> None:
        """Give back what the cache holds free (before an out-of-memory error): whole free segments, or, with
        expandable segments, the whole pages of every free block (``release_blocks``)."""
        self.stats.releases += 1
        for pool in self._pools.values():
            for block in list(pool.blocks.values()):
                if self.expandable:
                    self._unmap(pool, block)
                elif block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved -= self._segments.pop(block.segment)

    def _unmap(self, pool: _Pool, block: _Block) -> None:
        """``unmap_block``: unmap the whole pages inside free ``block``; the partial pages before and after stay
        mapped and free, the unmapped part merges with unmapped neighbours."""
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        end = block.start + block.size
        first, last = -(-block.start // page) * page, end // page * page
        if last <= first:
            return
        pool.remove(block)
        if first > block.start:
            before = _Block(block.segment, block.start, first - block.start, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.add(before)
        if end > last:
            after = _Block(block.segment, last, end - last, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.add(after)
        block.start, block.size, block.mapped = first, last - first, False
        self.reserved -= block.size
        pool.add_unmapped(_merge(pool, block))


def simulate(
    events: Iterable[Event | tuple[str, str, int, int]],
    expandable_segments: bool = False,
    capacity: int | None = None,
) -> Simulation:
    """Run a sequence of ``("alloc", name, bytes[, stream])`` and ``("free", name, _)`` events through the
    simulated allocator and return its peaks.

    Raises:
        OutOfMemory: With ``capacity``, when a reservation does not fit even after releasing the cache.
    """
    allocator = CachingAllocator(expandable_segments, capacity)
    for event in events:
        if event[0] == "alloc":
            allocator.malloc(event[1], event[2], event[3] if len(event) > 3 else 0)
        else:
            allocator.free(event[1])
    return allocator.stats


__all__ = [
    "CachingAllocator",
    "Event",
    "OutOfMemory",
    "Simulation",
    "round_size",
    "segment_size",
    "simulate",
]
