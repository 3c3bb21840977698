"""Profiles for a server: cached ones at once, new ones computed off the request path with bounded cost.

A request whose profile is cached is answered from the cache (pure Python, no torch in the server process). A new
config is profiled in one separate worker process (spawned once, importing torch and transformers there), at most
``limit_s`` seconds of work per profile; the request waits up to ``wait_s`` and otherwise gets
:class:`ProfilePending` (HTTP 503 with ``Retry-After``) while the work goes on and lands in the cache. Bad configs
come back as :class:`~tuner.workload.WorkloadError` naming the field, remembered in memory, never cached on disk.
Configs are data: nothing a request sends is ever run as code (``auto_map`` and ``trust_remote_code`` are refused).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from tuner.profile.cache import ProfileCache, canonical_config
from tuner.profile.model_profile import ModelProfile
from tuner.profile.profiles import cached_profile, refuse_custom_code
from tuner.workload import WorkloadError

WAIT_ENV = "DSTUNE_PROFILE_WAIT_S"


class ProfilePending(Exception):
    """The profile is being computed; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int = 5) -> None:
        super().__init__(f"the model profile is being computed; retry in {retry_after} s")
        self.retry_after = retry_after


def _profile_in_worker(
    config: dict[str, Any], seq_len: int, precisions: tuple[str, ...], attention: str, folder: str, limit_s: int
) -> tuple[str, str] | None:
    """Compute and cache the profile (in the worker process); a refusal comes back as ``(field, message)``."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit_s)
    try:
        from tuner.profile.profiles import model_profile

        for precision in precisions:
            model_profile(config, seq_len, precision, attention, (False, True), ProfileCache(Path(folder)))
        return None
    except WorkloadError as error:
        return error.field, str(error).removeprefix(f"{error.field}: ")
    except TimeoutError:
        return "model", f"profiling this model takes longer than {limit_s} s"
    except Exception as error:  # any other failure of transformers or torch on this config
        return "model", f"cannot profile this model: {' '.join(str(error).split())[:300]}"
    finally:
        signal.alarm(0)


class ProfileService:
    """Hands out model profiles to request handlers (thread-safe)."""

    def __init__(self, cache: ProfileCache | None = None, wait_s: float | None = None, limit_s: int = 120) -> None:
        self._cache = cache
        self.wait_s = float(os.environ.get(WAIT_ENV, "20")) if wait_s is None else wait_s
        self.limit_s = limit_s
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._running: dict[str, Future] = {}
        self._refused: OrderedDict[str, tuple[str, str]] = OrderedDict()

    @property
    def cache(self) -> ProfileCache:
        """The cache it reads and fills (by default the folder ``$DSTUNE_PROFILE_CACHE`` names now)."""
        return self._cache or ProfileCache()

    def profile(
        self, config: dict[str, Any], seq_len: int, precisions: tuple[str, ...], attention: str
    ) -> ModelProfile:
        """The profile for these settings (both checkpointing settings), from the cache or computed."""
        refuse_custom_code(config)
        cache = self.cache
        found = cached_profile(config, seq_len, precisions, attention, cache=cache)
        if found is not None:
            return found
        key = canonical_config([config, seq_len, precisions, attention, str(cache.folder)])
        with self._lock:
            if key in self._refused:
                raise WorkloadError(*self._refused[key])
            future = self._running.get(key)
            if future is None:
                future = self._submit(config, seq_len, precisions, attention, cache)
                self._running[key] = future
        try:
            refusal = future.result(timeout=self.wait_s)
        except FutureTimeout:
            raise ProfilePending() from None
        except BrokenProcessPool:
            refusal = ("model", "profiling this model ended its worker process (out of memory?)")
            with self._lock:
                self._pool = None
        finally:
            if future.done():
                with self._lock:
                    self._running.pop(key, None)
        if refusal is not None:
            with self._lock:
                self._refused[key] = refusal
                while len(self._refused) > 256:
                    self._refused.popitem(last=False)
            raise WorkloadError(*refusal)
        found = cached_profile(config, seq_len, precisions, attention, cache=cache)
        if found is None:
            raise WorkloadError("model", "the profile could not be read back from the cache")
        return found

    def _submit(
        self, config: dict[str, Any], seq_len: int, precisions: tuple[str, ...], attention: str, cache: ProfileCache
    ) -> Future:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(
            _profile_in_worker, config, seq_len, precisions, attention, str(cache.folder), self.limit_s
        )

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
