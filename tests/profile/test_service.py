"""The profiling service's bounds, with a worker the test controls in a thread pool (no torch, no worker process):
a full queue refuses new profiles at once, identical requests join one job, finished jobs free their slot whether or
not anyone came back for them, and refusals are remembered in a bounded LRU."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

# the new names are used through the module: a test file that cannot import a name is reported as skipped
# (--doctest-ignore-import-errors), not failed
from tuner.profile import service as service_module
from tuner.profile.cache import ProfileCache
from tuner.profile.service import ProfilePending, ProfileService
from tuner.workload import WorkloadError

DEADLINE_S = 60.0  # generous: each condition below is met in milliseconds on an idle machine


def config(size: int) -> dict[str, Any]:
    """A distinct model config (never profiled for real: the fake worker only records it)."""
    return {"model_type": "llama", "hidden_size": size}


def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (polled), failing after :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class FakeWorker:
    """Holds every job until ``release`` is set; records the hidden sizes it was given; refuses the listed ones."""

    def __init__(self, refuse: Callable[[int], bool] = lambda size: False) -> None:
        self.release = threading.Event()
        self.calls: list[int] = []
        self.refuse = refuse

    def __call__(
        self, config: dict[str, Any], seq_len: int, precisions: tuple[str, ...], attention: str, folder: str, limit: int
    ) -> tuple[str, str] | None:
        self.calls.append(config["hidden_size"])
        assert self.release.wait(DEADLINE_S), "the test never released the worker"
        if self.refuse(config["hidden_size"]):
            return "model.hidden_size", f"{config['hidden_size']} is not divisible by num_attention_heads"
        return None


@pytest.fixture
def worker() -> FakeWorker:
    return FakeWorker()


@pytest.fixture
def service(tmp_path: Path, worker: FakeWorker) -> Iterator[ProfileService]:
    """A service of at most 3 queued profiles that never waits, over an empty cache, running ``worker``."""
    service = ProfileService(
        ProfileCache(tmp_path), wait_s=0.0, max_queued=3, worker=worker, pool=lambda: ThreadPoolExecutor(1)
    )
    try:
        yield service
    finally:
        worker.release.set()
        service.close()


def ask(service: ProfileService, size: int) -> None:
    service.profile(config(size), 24, ("bf16",), "sdpa")


def test_a_full_queue_refuses_new_profiles_and_identical_requests_join_their_job(
    service: ProfileService, worker: FakeWorker
) -> None:
    for size in (64, 128, 192):
        with pytest.raises(ProfilePending):
            ask(service, size)
    assert service.queued == 3
    with pytest.raises(service_module.ProfileQueueFull) as full:
        ask(service, 256)
    assert "profiling queue is full" in str(full.value) and full.value.retry_after > 0
    assert "being computed" not in str(full.value)  # not the pending message: this request queued nothing
    for _ in range(3):  # asked again, even with another name for the same model: the one job, not a new one
        with pytest.raises(ProfilePending):
            ask(service, 64)
        with pytest.raises(ProfilePending):
            service.profile({**config(128), "_name_or_path": "elsewhere"}, 24, ("bf16",), "sdpa")
    assert service.queued == 3
    worker.release.set()
    until(lambda: service.queued == 0)
    assert worker.calls == [64, 128, 192]  # the refused profile never reached the worker, none ran twice
    worker.release.clear()
    with pytest.raises(ProfilePending):  # room again: queued
        ask(service, 256)
    assert service.queued == 1


def test_finished_jobs_free_their_slot_without_anyone_coming_back(service: ProfileService, worker: FakeWorker) -> None:
    for size in range(64, 64 * 11, 64):  # more distinct profiles than the queue holds, one after another
        with pytest.raises(ProfilePending):
            ask(service, size)
        worker.release.set()  # the job ends in the pool; nobody asks for its outcome
        until(lambda: service.queued == 0)
        worker.release.clear()
    assert len(worker.calls) == 10


def test_refusals_stay_422_and_are_remembered_in_a_bounded_lru(
    monkeypatch: pytest.MonkeyPatch, service: ProfileService, worker: FakeWorker
) -> None:
    monkeypatch.setattr(service_module, "REMEMBERED_REFUSALS", 2)
    worker.refuse = lambda size: True
    worker.release.set()
    service.wait_s = DEADLINE_S

    def refused(size: int) -> str:
        with pytest.raises(WorkloadError) as raised:
            ask(service, size)
        return raised.value.field

    assert refused(64) == "model.hidden_size"
    assert refused(128) == "model.hidden_size"
    assert refused(64) == "model.hidden_size"  # remembered (and now the most recent)
    assert worker.calls == [64, 128]
    refused(192)  # a third refusal: the least recently asked (128) is forgotten
    refused(64)
    refused(128)
    assert worker.calls == [64, 128, 192, 128]


def test_the_queue_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(service_module.QUEUE_ENV, raising=False)
    assert ProfileService().max_queued == service_module.MAX_QUEUED
    monkeypatch.setenv(service_module.QUEUE_ENV, "5")
    assert ProfileService().max_queued == 5
    monkeypatch.setenv(service_module.QUEUE_ENV, "0")
    with pytest.raises(ValueError, match=service_module.QUEUE_ENV):
        ProfileService()


def test_several_lengths_are_traced_in_one_job_and_read_back_together(tmp_path: Path) -> None:
    """``seq_len: "max"`` on the API needs the model at three lengths: one job traces them together (each
    checkpointing setting's copy built once) and the answer holds all three; a later request for one of them is
    answered from the cache. The worker runs the real trace (only the per-job time limit, a signal, is left out)."""
    from tiny_configs import TINY_CONFIGS

    from tuner.profile.describe import lengths_profile

    jobs: list[Any] = []

    def tracing_worker(
        config: dict[str, Any], seq_len: Any, precisions: tuple[str, ...], attention: str, folder: str, limit: int
    ) -> None:
        jobs.append(seq_len)
        for precision in precisions:
            lengths_profile(config, seq_len, precision, attention, (False, True), ProfileCache(Path(folder)))

    service = ProfileService(
        ProfileCache(tmp_path), wait_s=DEADLINE_S, worker=tracing_worker, pool=lambda: ThreadPoolExecutor(1)
    )
    try:
        tiny = TINY_CONFIGS["llama"]
        profile = service.profile(tiny, 64, ("bf16",), "sdpa", lengths=(16, 32, 64))
        assert jobs == [(64, 16, 32)]  # one job for the three lengths
        assert {entry.seq_len for entry in profile.activations} == {16, 32, 64}
        assert {entry.checkpointing for entry in profile.activations} == {False, True}
        assert service.profile(tiny, 32, ("bf16",), "sdpa").activations  # from the cache: no second job
        assert jobs == [(64, 16, 32)]
    finally:
        service.close()
