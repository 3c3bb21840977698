"""A memory and time bound around building a model from a config (:func:`build_bound`): every build, the CLI's and
the worker's in their own process as the API's in its profiling process, ends within :data:`BUILD_LIMIT_S` seconds
and :data:`BUILD_BYTES` more address space (at most half of what the host has available), or is refused as a
:class:`~tuner.workload.WorkloadError` naming ``model``.

Validation bounds each dimension (:mod:`tuner.workload.config_bounds`); this bounds what they make together (a deep
model of many experts, a layout transformers builds slowly) without a limit per combination. Unix: the memory bound
is the process's ``RLIMIT_AS`` soft limit, lowered for the build and restored after; the time bound is ``SIGALRM``,
set in the main thread only (a build in another thread has the memory bound alone), inside any alarm already set.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from tuner.units import format_bytes
from tuner.workload import WorkloadError

BUILD_LIMIT_S = 120
BUILD_BYTES = 16 * 2**30


class BuildTimeout(Exception):
    """The build ran past its time bound."""


def _address_space() -> int:
    """This process's virtual memory size now (bytes), from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _available() -> int:
    """The host's available memory (bytes)."""
    import psutil

    return int(psutil.virtual_memory().available)


@contextlib.contextmanager
def build_bound(limit_s: int | None = None, extra_bytes: int | None = None) -> Iterator[None]:
    """Run the block with at most ``limit_s`` seconds (default :data:`BUILD_LIMIT_S`) and ``extra_bytes`` more
    address space (default :data:`BUILD_BYTES`, at most half the host's available memory); past either, a
    :class:`WorkloadError` at ``model``."""
    limit_s = BUILD_LIMIT_S if limit_s is None else limit_s
    extra = min(BUILD_BYTES, _available() // 2) if extra_bytes is None else extra_bytes
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft == resource.RLIM_INFINITY or cap < soft:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    timer = _Alarm(limit_s) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    except MemoryError:
        raise WorkloadError("model", f"building this model takes more than {format_bytes(extra)} of memory") from None
    except BuildTimeout:
        raise WorkloadError("model", f"building this model takes longer than {limit_s} s") from None
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        if timer is not None:
            timer.restore()


class _Alarm:
    """``SIGALRM`` after ``limit_s`` (or the alarm already set, if sooner), raising :class:`BuildTimeout`; restored
    to what was set before by :meth:`restore`."""

    def __init__(self, limit_s: int) -> None:
        self.started = time.monotonic()
        self.previous_handler: Any = signal.signal(signal.SIGALRM, self._expired)
        self.previous_left = signal.alarm(0)
        own = limit_s if not self.previous_left else min(limit_s, self.previous_left)
        self.fires_first = own == limit_s
        signal.alarm(max(1, own))

    def _expired(self, signum: int, frame: Any) -> None:
        if self.fires_first:
            raise BuildTimeout
        if callable(self.previous_handler):  # the outer alarm's turn: its own handler says what it means
            self.previous_handler(signum, frame)

    def restore(self) -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous_handler)
        if self.previous_left:
            signal.alarm(max(1, self.previous_left - int(time.monotonic() - self.started)))


__all__ = ["BUILD_BYTES", "BUILD_LIMIT_S", "BuildTimeout", "build_bound"]
