"""Profiles for a server: cached ones at once, new ones computed off the request path with bounded cost.

A request whose profile is cached is answered from the cache (pure Python, no torch in the server process). A new
config is profiled in one separate worker process (spawned once, importing torch and transformers there), at most
``limit_s`` seconds of work per profile; the request waits up to ``wait_s`` and otherwise gets
:class:`ProfilePending` (HTTP 503 with ``Retry-After``) while the work goes on and lands in the cache. Bad configs
come back as :class:`~tuner.workload.WorkloadError` naming the field, remembered in memory (the
:data:`REMEMBERED_REFUSALS` most recently asked for), never cached on disk. Configs are data: nothing a request sends
is ever run as code (``auto_map`` and ``trust_remote_code`` are refused).

The queue is bounded: requests for a profile already queued or in progress join that job, and at most
``max_queued`` distinct profiles (:data:`MAX_QUEUED`, or ``$DSTUNE_PROFILE_QUEUE``) wait for or occupy the worker;
a new one past that gets :class:`ProfileQueueFull` (HTTP 503 with ``Retry-After``) and nothing is queued. Each API
server process has its own service. The CLI and the job worker profile in their own process and never come here.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from tuner import env
from tuner.profile.cache import ProfileCache, canonical_config
from tuner.profile.config_checks import refuse_custom_code
from tuner.profile.describe import cached_profile
from tuner.profile.lifetime import watch_parent
from tuner.workload import ModelProfile, TrainableSpec, WorkloadError

WAIT_ENV = "DSTUNE_PROFILE_WAIT_S"
QUEUE_ENV = "DSTUNE_PROFILE_QUEUE"
MAX_QUEUED = 32  # distinct profiles waiting for or being computed in the worker, per service
REMEMBERED_REFUSALS = 256  # bad configs' refusals kept in memory, the most recently asked for
QUEUE_FULL_RETRY_S = 10  # a slot frees when the oldest queued profile ends: usually seconds, at most limit_s

Refusal = tuple[str, str]  # (field, message): why a config cannot be profiled
Lengths = int | tuple[int, ...]  # one sequence length, or several traced together in one job
Worker = Callable[[dict[str, Any], Lengths, tuple[str, ...], str | None, str, int], Refusal | None]


class ProfilePending(Exception):
    """The profile is being computed; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int = 5) -> None:
        super().__init__(f"the model profile is being computed; retry in {retry_after} s")
        self.retry_after = retry_after


class ProfileQueueFull(Exception):
    """The profiling queue holds as many new models as it takes; nothing was queued: retry after ``retry_after``
    seconds."""

    def __init__(self, queued: int, retry_after: int = QUEUE_FULL_RETRY_S) -> None:
        super().__init__(f"the profiling queue is full ({queued} new model profiles queued); retry in {retry_after} s")
        self.queued = queued
        self.retry_after = retry_after


def _profile_in_worker(
    config: dict[str, Any],
    seq_len: Lengths,
    precisions: tuple[str, ...],
    attention: str | None,
    folder: str,
    limit_s: int,
    trainable: TrainableSpec | None = None,
) -> Refusal | None:
    """Compute and cache the profile (in the worker process), of the model as trained with a non-full
    ``trainable`` (its adapter and freeze pattern applied there: torch and peft never load in the server); a
    refusal comes back as ``(field, message)``. Several lengths (a tuple) are traced together: each checkpointing
    setting's copy of the model built once for all of them (:func:`tuner.profile.describe.lengths_profile`)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit_s)
    try:
        from tuner.profile.describe import lengths_profile

        lengths = seq_len if isinstance(seq_len, tuple) else (seq_len,)
        for precision in precisions:
            lengths_profile(config, lengths, precision, attention, (False, True), ProfileCache(Path(folder)), trainable)
        return None
    except WorkloadError as error:
        return error.field, str(error).removeprefix(f"{error.field}: ")
    except TimeoutError:
        return "model", f"profiling this model takes longer than {limit_s} s"
    except Exception as error:  # any other failure of transformers or torch on this config
        return "model", f"cannot profile this model: {' '.join(str(error).split())[:300]}"
    finally:
        signal.alarm(0)


def _spawn_pool() -> Executor:
    """One worker process, spawned (not forked from a server with threads), started on the first job; it ends when
    the server process does, however that ends (:func:`tuner.profile.lifetime.watch_parent`)."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=watch_parent,
        initargs=(os.getpid(),),
    )


def _job_key(
    config: dict[str, Any],
    seq_len: Lengths,
    precisions: tuple[str, ...],
    attention: str | None,
    folder: str,
    trainable: TrainableSpec | None = None,
) -> str:
    """A short digest naming one job: what is kept in memory per job, however large the config."""
    parts: list[Any] = [canonical_config(config), list(seq_len) if isinstance(seq_len, tuple) else seq_len]
    parts += [list(precisions), attention, folder]
    if trainable is not None and not trainable.is_full:
        parts.append(trainable.to_dict())
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _outcome(future: Future[Refusal | None]) -> Refusal | None:
    """A finished job's refusal, or None (profiled and cached, or cancelled)."""
    if future.cancelled():
        return None
    error = future.exception()
    if error is None:
        return future.result()
    if isinstance(error, BrokenExecutor):
        return "model", "profiling this model ended its worker process (out of memory?)"
    return "model", f"cannot profile this model: {' '.join(str(error).split())[:300]}"


def _cached_lengths(
    config: dict[str, Any],
    lengths: tuple[int, ...],
    precisions: tuple[str, ...],
    attention: str | None,
    cache: ProfileCache,
    trainable: TrainableSpec | None,
) -> ModelProfile | None:
    """The cached profile holding every one of ``lengths``' activations, or None when any is missing."""
    merged: ModelProfile | None = None
    for length in lengths:
        found = cached_profile(config, length, precisions, attention, cache=cache, trainable=trainable)
        if found is None:
            return None
        merged = found if merged is None else merged.with_activations(found.activations)
    return merged


class ProfileService:
    """Hands out model profiles to request handlers (thread-safe; see the module docstring).

    ``max_queued``: the most distinct profiles queued or in progress (default ``$DSTUNE_PROFILE_QUEUE``, else
    :data:`MAX_QUEUED`). ``worker`` computes one profile in an executor made by ``pool`` (by default
    :func:`_profile_in_worker` in one spawned process; tests pass a thread pool and a function they control)."""

    def __init__(
        self,
        cache: ProfileCache | None = None,
        wait_s: float | None = None,
        limit_s: int = 120,
        max_queued: int | None = None,
        *,
        worker: Worker = _profile_in_worker,
        pool: Callable[[], Executor] = _spawn_pool,
    ) -> None:
        self._cache = cache
        settings = env.current()
        self.wait_s = settings.profile_wait_s if wait_s is None else wait_s
        self.limit_s = limit_s
        self.max_queued = settings.profile_queue if max_queued is None else max_queued
        if self.max_queued < 1:
            raise ValueError(f"the profiling queue must hold at least 1 profile ({QUEUE_ENV}), not {self.max_queued}")
        self._worker, self._new_pool = worker, pool
        self._lock = threading.Lock()
        self._pool: Executor | None = None
        self._running: dict[str, Future[Refusal | None]] = {}  # queued or in progress (finished ones until collected)
        self._refused: OrderedDict[str, Refusal] = OrderedDict()

    @property
    def cache(self) -> ProfileCache:
        """The cache it reads and fills (by default the folder ``$DSTUNE_PROFILE_CACHE`` names now)."""
        return self._cache or ProfileCache()

    @property
    def queued(self) -> int:
        """How many distinct profiles are queued or in progress now."""
        with self._lock:
            self._collect()
            return len(self._running)

    def profile(
        self,
        config: dict[str, Any],
        seq_len: int,
        precisions: tuple[str, ...],
        attention: str | None,
        trainable: TrainableSpec | None = None,
        lengths: tuple[int, ...] = (),
    ) -> ModelProfile:
        """The profile for these settings (both checkpointing settings), from the cache or computed; ``attention``
        None: the one transformers resolves for the model (``profile.attention``); a non-full ``trainable``: of the
        model as trained (peft's adapter and the freeze pattern applied in the worker process). ``lengths``: more
        sequence lengths the profile holds, traced in the same job (``seq_len: "max"`` asks for three: one job, one
        wait, instead of one 503 per length).

        Raises :class:`ProfilePending` past ``wait_s``, :class:`ProfileQueueFull` for a new profile while the queue
        is full, :class:`WorkloadError` for a config that cannot be profiled."""
        refuse_custom_code(config)
        trainable = None if trainable is None or trainable.is_full else trainable
        cache = self.cache
        every = tuple(dict.fromkeys((seq_len, *lengths)))
        job: Lengths = every if len(every) > 1 else seq_len
        found = _cached_lengths(config, every, precisions, attention, cache, trainable)
        if found is not None:
            return found
        key = _job_key(config, job, precisions, attention, str(cache.folder), trainable)
        with self._lock:
            self._collect()
            refusal = self._refused.get(key)
            if refusal is not None:
                self._refused.move_to_end(key)
                raise WorkloadError(*refusal)
            future = self._running.get(key)  # the same profile asked again: join its job
            if future is None:
                if len(self._running) >= self.max_queued:
                    raise ProfileQueueFull(len(self._running))
                future = self._running[key] = self._submit(config, job, precisions, attention, cache, trainable)
        if not wait([future], timeout=self.wait_s).done:
            raise ProfilePending()
        with self._lock:
            refusal = self._settle(key, future)
        if future.cancelled():  # the service was closed: the job is gone, a retry queues it again
            raise ProfilePending()
        if refusal is not None:
            raise WorkloadError(*refusal)
        found = _cached_lengths(config, every, precisions, attention, cache, trainable)
        if found is None:
            raise WorkloadError("model", "the profile could not be read back from the cache")
        return found

    def _collect(self) -> None:
        """Forget finished jobs, remembering refusals (under the lock): only unfinished jobs count against the queue,
        whether or not a request came back for their outcome."""
        for key, future in list(self._running.items()):
            if future.done():
                self._settle(key, future)

    def _settle(self, key: str, future: Future[Refusal | None]) -> Refusal | None:
        """A finished job's refusal, remembered, and the job forgotten (under the lock)."""
        if self._running.get(key) is future:
            del self._running[key]
        refusal = _outcome(future)
        if refusal is not None:
            self._refused[key] = refusal
            self._refused.move_to_end(key)
            while len(self._refused) > REMEMBERED_REFUSALS:
                self._refused.popitem(last=False)
        return refusal

    def _submit(
        self,
        config: dict[str, Any],
        seq_len: Lengths,
        precisions: tuple[str, ...],
        attention: str | None,
        cache: ProfileCache,
        trainable: TrainableSpec | None = None,
    ) -> Future[Refusal | None]:
        args: tuple[Any, ...] = (config, seq_len, precisions, attention, str(cache.folder), self.limit_s)
        if trainable is not None:  # only then: a worker function for full models takes the six arguments
            args = (*args, trainable)
        if self._pool is None:
            self._pool = self._new_pool()
        try:
            return self._pool.submit(self._worker, *args)
        except BrokenExecutor:  # an earlier profile ended the worker process: a new one for this profile
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            return self._pool.submit(self._worker, *args)

    def close(self) -> None:
        """Stop the worker process (work in flight is abandoned)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None


_default: ProfileService | None = None
_default_lock = threading.Lock()


def default_service() -> ProfileService:
    """The process-wide service (created on first use, with the default cache folder)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ProfileService()
        return _default
