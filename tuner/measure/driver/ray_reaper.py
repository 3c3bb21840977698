"""The private local Ray dies with the dstune process that started it (:func:`start_reaper`), even a SIGKILLed one.

Ray starts its head processes (GCS, raylet, dashboard, monitors) sharing the driver's fate (``PR_SET_PDEATHSIG``),
but the raylet's own children, the dashboard and runtime-env agents (about 210 MB), notice their raylet's death
within 2 s and then report it to the GCS, which died too, through a call with a fixed 60 s timeout
(``ray/_private/utils.py``, ``publish_error_to_driver``): they lived on about 70 s after a SIGKILLed ``dstune tune
--launcher ray``. So dstune starts, beside a private local Ray, a small reaper process in a session of its own: it
holds the read end of a pipe whose write end only dstune holds, notes every descendant of the raylet (with its
start time, so a reused pid is never taken for it), and when the pipe ends (dstune exited, however) it stops those
still alive: SIGTERM, then SIGKILL after :data:`GRACE_S`. After an ordinary exit Ray has stopped them already.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

POLL_S = 0.5  # how often the reaper notes the raylet's descendants
GRACE_S = 3.0  # between SIGTERM and SIGKILL
AGENTS = 2  # the raylet's children from its start: the dashboard agent and the runtime-env agent
AGENTS_WAIT_S = 15.0  # the longest the first note waits for them (a loaded host starts them late)
_started: list[subprocess.Popen[bytes]] = []  # the reaper of this process (its pipe must stay open while it lives)


def start_reaper() -> None:
    """Start this process's reaper once (after starting a private local Ray), and wait until it has noted Ray's
    agents (its first line; an empty one if it could not start): a dstune killed right after starting Ray leaves
    none behind."""
    if _started:
        return
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tuner.measure.driver.ray_reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not stopped by the terminal's Ctrl-C before dstune has stopped Ray itself
    )
    _started.append(reaper)
    assert reaper.stdout is not None
    reaper.stdout.readline()
    reaper.stdout.close()


def ray_descendants(parent: Any) -> set[tuple[int, float]]:
    """(pid, start time) of every descendant of ``parent``'s raylet (a :class:`psutil.Process`)."""
    import psutil

    found: set[tuple[int, float]] = set()
    try:
        children = parent.children()
    except psutil.Error:
        return found
    for child in children:
        try:
            if child.name() == "raylet":
                found |= {(process.pid, process.create_time()) for process in child.children(recursive=True)}
        except psutil.Error:
            continue
    return found


def reap(noted: set[tuple[int, float]]) -> int:
    """Stop the noted processes still alive (the same start time: not a reused pid); returns how many."""
    import psutil

    alive = []
    for pid, started in noted:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.terminate()
                alive.append(process)
        except psutil.Error:
            continue
    _, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            continue
    return len(alive)


def main(parent_pid: int) -> None:
    """Note the raylet's descendants of ``parent_pid`` until stdin ends, then reap them."""
    import psutil

    try:
        parent = psutil.Process(parent_pid)
    except psutil.Error:
        return
    noted = ray_descendants(parent)
    deadline = time.monotonic() + AGENTS_WAIT_S
    while len(noted) < AGENTS and time.monotonic() < deadline:  # the raylet starts its agents just after itself
        time.sleep(0.1)
        noted |= ray_descendants(parent)
    print("noted", len(noted), flush=True)  # start_reaper waits for this: Ray's agents are noted
    while True:
        readable, _, _ = select.select([sys.stdin.buffer], [], [], POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 1):
            break  # the write end closed: the parent exited, or was killed
        noted |= ray_descendants(parent)
    reap(noted)


if __name__ == "__main__":
    main(int(sys.argv[1]))
