"""Who holds a running trial: a process identity, and whether that holder is still alive.

A trial the loop starts is stamped with its holder's identity, ``host:pid:start/token``: ``start`` is the process's
start time in clock ticks since boot (so a reused pid is not mistaken for the owner) and ``token`` names one holder
inside the process (one study run; :func:`new_holder`, until :func:`release`), and a lease the loop renews. A resuming
study fails only the running trials nobody holds any more: a holder on this host whose process is gone (or, in this
process, that was released), or a holder elsewhere whose lease has passed. Another live study on the same trials is
left alone.

Example:
    >>> holder = new_holder()
    >>> owner_alive(holder), owner_alive(process_owner())
    (True, True)
    >>> release(holder)
    >>> owner_alive(holder)
    False
    >>> owner_alive("elsewhere.example:1:1") is None  # another host: only its lease can tell
    True
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
import threading

_live: set[str] = set()
_lock = threading.Lock()


def _start_ticks(pid: int) -> str | None:
    """The process's start time since boot (``/proc/PID/stat`` field 22), or None when there is no such process or it
    has died (a zombie its parent has not reaped yet is dead too)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name: field 3 (state) is the first
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@functools.cache
def _host() -> str:
    return socket.gethostname()


def process_owner(pid: int | None = None) -> str:
    """This process's identity (or ``pid``'s): ``host:pid:start``."""
    pid = os.getpid() if pid is None else pid
    return f"{_host()}:{pid}:{_start_ticks(pid) or 0}"


def new_holder() -> str:
    """A fresh holder in this process (``host:pid:start/token``), alive until :func:`release`."""
    holder = f"{process_owner()}/{secrets.token_hex(4)}"
    with _lock:
        _live.add(holder)
    return holder


def release(holder: str) -> None:
    """End ``holder``: what it still holds counts as abandoned from now on."""
    with _lock:
        _live.discard(holder)


def owner_alive(owner: str) -> bool | None:
    """True when ``owner`` is a live holder on this host, False when it is gone, None when it is on another host (or
    the identity is not one this module made)."""
    process, _, token = owner.partition("/")
    host, pid, start = [*process.rsplit(":", 2), "", ""][:3]
    if host != _host() or not pid.isdigit():
        return None
    if _start_ticks(int(pid)) != start:
        return False
    if token and process == process_owner():
        with _lock:
            return owner in _live
    return True


__all__ = ["new_holder", "owner_alive", "process_owner", "release"]
