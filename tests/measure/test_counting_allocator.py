"""The counting allocator: torch's CPU allocations and frees counted on every thread, with a resettable peak."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tuner.measure.rank.counting_allocator import CountingAllocator, counting_allocator, library_path  # noqa: E402


@pytest.fixture(scope="module")
def counter() -> CountingAllocator:
    found = counting_allocator()
    if found is None:
        pytest.fail("the counting allocator did not build (no C++ compiler?)")
    return found


def test_allocations_and_frees_are_counted_whichever_thread_makes_them(counter: CountingAllocator) -> None:
    base = counter.live
    held = [torch.empty(4096, dtype=torch.uint8)]
    assert counter.live - base == 4096
    other = threading.Thread(target=lambda: held.append(torch.empty(1000, dtype=torch.uint8)))
    other.start()
    other.join()
    assert counter.live - base == 5096
    freer = threading.Thread(target=held.clear)  # the last references drop on another thread
    freer.start()
    freer.join()
    assert counter.live == base


def test_the_peak_is_the_high_water_mark_since_the_last_reset(counter: CountingAllocator) -> None:
    counter.reset_peak()
    base = counter.live
    a = torch.empty(10_000, dtype=torch.uint8)
    del a
    b = torch.empty(3_000, dtype=torch.uint8)
    assert counter.peak - base == 10_000
    counter.reset_peak()
    assert counter.peak - base == 3_000
    del b


def test_raw_allocations_keep_torchs_contract(counter: CountingAllocator) -> None:
    """Kernels that allocate raw scratch memory (CPU linear layers, oneDNN) need the context to be the data."""
    base = counter.live
    out = torch.nn.functional.linear(torch.randn(64, 128), torch.randn(256, 128))
    assert counter.live - base == out.numel() * 4
    del out
    assert counter.live == base


def test_one_library_per_torch_build_and_source(tmp_path: Path) -> None:
    path = library_path(tmp_path)
    assert path.parent == tmp_path and path.name.startswith("dstune_counting_allocator_") and path.suffix == ".so"
    assert library_path(tmp_path) == path
