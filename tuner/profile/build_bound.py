"""A memory and time bound around building a model from a config (:func:`build_bound`): every build, the CLI's and
the worker's in their own process as the API's in its profiling process, ends within :data:`BUILD_LIMIT_S` seconds
and :data:`BUILD_BYTES` more resident memory (at most half of what the host has available), or is refused as a
:class:`~tuner.workload.WorkloadError` naming ``model``.

Validation bounds each dimension (:mod:`tuner.workload.config_bounds`); this bounds what they make together (a deep
model of many experts, a layout transformers builds slowly) without a limit per combination. Unix, main thread: the
time bound is ``SIGALRM`` (inside any alarm already set); the memory bound a watcher thread that reads the process's
resident memory every :data:`WATCH_S` seconds and, past the bound, signals the main thread (building is Python code
constructing modules: the signal is taken within a module). An address-space limit is no bound here: torch crashes
on a failed allocation instead of raising. A build in another thread is not bounded (none is: the CLI, the worker
and the profiling process build in their main thread).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from tuner.units import format_bytes
from tuner.workload import WorkloadError

BUILD_LIMIT_S = 120
BUILD_BYTES = 16 * 2**30
WATCH_S = 0.05


class BuildTimeout(Exception):
    """The build ran past its time bound."""


class BuildMemory(Exception):
    """The build grew past its memory bound."""


def _resident() -> int:
    """This process's resident memory now (bytes), from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available() -> int:
    """The host's available memory (bytes)."""
    import psutil

    return int(psutil.virtual_memory().available)


@contextlib.contextmanager
def build_bound(limit_s: int | None = None, extra_bytes: int | None = None) -> Iterator[None]:
    """Run the block with at most ``limit_s`` seconds (default :data:`BUILD_LIMIT_S`) and ``extra_bytes`` more
    resident memory (default :data:`BUILD_BYTES`, at most half the host's available memory); past either, a
    :class:`WorkloadError` at ``model``. Outside the main thread: the block as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    limit_s = BUILD_LIMIT_S if limit_s is None else limit_s
    extra = min(BUILD_BYTES, _available() // 2) if extra_bytes is None else extra_bytes
    alarm = _Alarm(limit_s)
    watcher = _Watcher(_resident() + extra, alarm)
    try:
        yield
    except BuildMemory:
        raise WorkloadError("model", f"building this model takes more than {format_bytes(extra)} of memory") from None
    except BuildTimeout:
        raise WorkloadError("model", f"building this model takes longer than {limit_s} s") from None
    finally:
        watcher.stop()
        alarm.restore()


class _Alarm:
    """``SIGALRM`` after ``limit_s`` (or the alarm already set, if sooner), raising :class:`BuildTimeout` (or
    :class:`BuildMemory` when the watcher sent it); restored to what was set before by :meth:`restore`."""

    def __init__(self, limit_s: int) -> None:
        self.started = time.monotonic()
        self.over_memory = False
        self.previous_handler: Any = signal.signal(signal.SIGALRM, self._expired)
        self.previous_left = signal.alarm(0)
        own = limit_s if not self.previous_left else min(limit_s, self.previous_left)
        self.fires_first = own == limit_s
        signal.alarm(max(1, own))

    def _expired(self, signum: int, frame: Any) -> None:
        if self.over_memory:
            raise BuildMemory
        if self.fires_first:
            raise BuildTimeout
        if callable(self.previous_handler):  # the outer alarm's turn: its own handler says what it means
            self.previous_handler(signum, frame)

    def restore(self) -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous_handler)
        if self.previous_left:
            signal.alarm(max(1, self.previous_left - int(time.monotonic() - self.started)))


class _Watcher:
    """A daemon thread that signals the main thread (through ``alarm``) once resident memory passes ``cap``."""

    def __init__(self, cap: int, alarm: _Alarm) -> None:
        self.cap, self.alarm = cap, alarm
        self.done = threading.Event()
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self._watch, name="dstune-build-bound", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(WATCH_S):
            if _resident() > self.cap:
                self.alarm.over_memory = True
                signal.pthread_kill(self.main or 0, signal.SIGALRM)
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


__all__ = ["BUILD_BYTES", "BUILD_LIMIT_S", "BuildMemory", "BuildTimeout", "build_bound"]
