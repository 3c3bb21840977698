"""SIGTERM handled as Ctrl-C (:func:`install`): what ``timeout``, systemd and ``docker stop`` send stops a command as
Ctrl-C does (a study records what finished and marks nothing left running, a worker gives its job back, the node's
fork servers are released at exit), says so in one line, and the command exits 143 (128 + SIGTERM), as a shell
reports a process that SIGTERM ended (:func:`exit_code`). A second SIGTERM, like a second Ctrl-C, stops at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import typer

TERM_EXIT = 128 + signal.SIGTERM
_terminated = threading.Event()


def _as_ctrl_c(signum: int, frame: Any) -> None:
    """Hand SIGTERM to whatever handles Ctrl-C now (Python's KeyboardInterrupt, or a study's deferred stop)."""
    if not _terminated.is_set():
        typer.echo("terminated (SIGTERM): stopping as on Ctrl-C", err=True)
    _terminated.set()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def install() -> None:
    """Handle SIGTERM as Ctrl-C from now on in this process (the main thread only: signals are delivered there)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_ctrl_c)


def terminated() -> bool:
    """Whether a SIGTERM arrived."""
    return _terminated.is_set()


def exit_code(code: int) -> int:
    """The command's exit code: :data:`TERM_EXIT` after a SIGTERM, else ``code``."""
    return TERM_EXIT if terminated() else code


__all__ = ["TERM_EXIT", "exit_code", "install", "terminated"]
