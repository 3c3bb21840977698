"""The stale-while-revalidate answer cache: real asyncio and worker threads, a fake clock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tuner.api.answer_cache import AnswerCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """A blocking computation that counts its calls; ``gate`` holds it until set."""

    def __init__(self, answer: object = "a") -> None:
        self.answer, self.calls = answer, 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> object:
        self.calls += 1
        self.gate.wait(10)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Infeasible(Exception):
    pass


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_misses_compute_once() -> None:
    cache, source = AnswerCache(2.0), Source()

    async def scenario() -> list[object]:
        source.gate.clear()
        waiting = [asyncio.create_task(cache.get("k", source)) for _ in range(50)]
        await asyncio.sleep(0.05)
        source.gate.set()
        return await asyncio.gather(*waiting)

    assert run(scenario()) == ["a"] * 50 and source.calls == 1


def test_fresh_answers_come_from_memory_and_stale_ones_refresh_once_in_the_background() -> None:
    clock, source = Clock(), Source("old")
    cache = AnswerCache(2.0, max_stale_s=60, clock=clock)

    async def scenario() -> None:
        assert await cache.get("k", source) == "old"
        clock.now += 1.9
        assert await cache.get("k", source) == "old" and source.calls == 1
        clock.now += 0.2  # stale: answered at once, one refresh however many ask meanwhile
        source.answer = "new"
        source.gate.clear()
        assert [await cache.get("k", source) for _ in range(20)] == ["old"] * 20
        source.gate.set()
        await asyncio.sleep(0.05)
        while cache._computing:
            await asyncio.sleep(0.01)
        assert source.calls == 2
        assert await cache.get("k", source) == "new" and source.calls == 2

    run(scenario())


def test_a_failing_refresh_keeps_the_stale_answer_until_max_stale() -> None:
    clock, source = Clock(), Source("kept")
    cache = AnswerCache(2.0, max_stale_s=30, clock=clock)

    async def scenario() -> None:
        await cache.get("k", source)
        source.answer = ConnectionError("database down")
        clock.now += 10
        assert await cache.get("k", source) == "kept"
        while cache._computing:
            await asyncio.sleep(0.01)
        assert await cache.get("k", source) == "kept" and source.calls >= 2
        clock.now += 30  # too old to serve: the caller waits for a computation and gets its error
        with pytest.raises(ConnectionError, match="database down"):
            await cache.get("k", source)

    run(scenario())


def test_cached_errors_are_answers_and_other_errors_are_not_cached() -> None:
    clock = Clock()
    cache = AnswerCache(2.0, clock=clock, cache_errors=(Infeasible,))
    infeasible, broken = Source(Infeasible("nothing fits")), Source(RuntimeError("bug"))

    async def scenario() -> None:
        for _ in range(3):
            with pytest.raises(Infeasible, match="nothing fits") as raised:
                await cache.get("i", infeasible)
        assert infeasible.calls == 1
        assert len(raised.traceback) < 5  # re-raising the cached error does not grow its traceback
        for _ in range(3):
            with pytest.raises(RuntimeError):
                await cache.get("b", broken)
        assert broken.calls == 3

    run(scenario())


def test_a_caller_that_goes_away_does_not_cancel_the_others() -> None:
    cache, source = AnswerCache(2.0), Source()

    async def scenario() -> object:
        source.gate.clear()
        leaving = asyncio.create_task(cache.get("k", source))
        staying = asyncio.create_task(cache.get("k", source))
        await asyncio.sleep(0.05)
        leaving.cancel()
        source.gate.set()
        return await staying

    assert run(scenario()) == "a" and source.calls == 1


def test_ttl_zero_computes_every_time_and_the_oldest_entries_go_first() -> None:
    uncached, source = AnswerCache(0.0), Source()

    async def scenario() -> None:
        for _ in range(3):
            await uncached.get("k", source)
        assert source.calls == 3
        small, counted = AnswerCache(5.0, max_entries=2), Source()
        for key in ("a", "b", "c"):
            await small.get(key, counted)
        assert list(small._entries) == ["b", "c"]
        await small.get("a", counted)
        assert counted.calls == 4

    run(scenario())


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        AnswerCache(-1.0)
    with pytest.raises(ValueError):
        AnswerCache(10.0, max_stale_s=5.0)


def test_an_answer_that_took_longer_than_its_ttl_is_fresh_from_when_it_is_known() -> None:
    clock = Clock()
    cache = AnswerCache(2.0, max_stale_s=60, clock=clock)
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        clock.now += 30  # the computation took 30 s, past the 2 s ttl
        return "a"

    async def scenario() -> list[str]:
        first = await cache.get("k", slow)
        clock.now += 1
        second = await cache.get("k", slow)
        await asyncio.sleep(0.1)  # a refresh, had one started, would have called slow again
        return [first, second]

    assert run(scenario()) == ["a", "a"] and len(calls) == 1  # not stale on arrival: no refresh


def test_with_slots_a_miss_without_one_is_busy_before_anything_starts_and_joining_needs_none() -> None:
    from tuner.api.slots import Busy, Slots

    slots = Slots(per_server=2, per_client=1)
    cache, held, other = AnswerCache(60.0, slots=slots), Source("held"), Source("other")

    async def scenario() -> None:
        held.gate.clear()
        first = asyncio.create_task(cache.get("k1", held, client="a"))
        await asyncio.sleep(0.05)
        joined = asyncio.create_task(cache.get("k1", held, client="a"))  # the same answer: no slot needed
        with pytest.raises(Busy, match="this client"):
            await cache.get("k2", other, client="a")
        second = asyncio.create_task(cache.get("k2", other, client="b"))
        assert await second == "other"
        other.gate.clear()
        third = asyncio.create_task(cache.get("k3", other, client="b"))
        await asyncio.sleep(0.05)
        with pytest.raises(Busy, match="this server"):
            await cache.get("k4", other, client="c")
        held.gate.set()
        other.gate.set()
        assert await asyncio.gather(first, joined, third) == ["held", "held", "other"]

    run(scenario())
    assert held.calls == 1 and other.calls == 2 and slots.held == 0
