"""A helper process ends with the process that started it, however that one ends (a clean stop, SIGTERM, SIGKILL,
an out-of-memory kill): the child watches its parent's pid and exits when it changes (the parent is gone and the
child was re-parented). Watching works from any thread that started the child, unlike Linux's ``PR_SET_PDEATHSIG``,
which fires when the *thread* that forked exits (a pool's child started from a request's worker thread would die
with that thread).

Example:
    >>> import os
    >>> watch_parent(os.getppid(), interval_s=60.0).daemon
    True
"""

from __future__ import annotations

import os
import threading
import time

WATCH_INTERVAL_S = 0.5


def _watch(parent_pid: int, interval_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    os._exit(1)  # the parent is gone: no cleanup that could block (a profile in flight is abandoned)


def watch_parent(parent_pid: int, interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """In a child process: exit as soon as ``parent_pid`` is no longer this process's parent (a daemon thread)."""
    thread = threading.Thread(target=_watch, args=(parent_pid, interval_s), name="dstune-watch-parent", daemon=True)
    thread.start()
    return thread


__all__ = ["WATCH_INTERVAL_S", "watch_parent"]
