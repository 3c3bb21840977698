"""The signals that end a process by default handled as Ctrl-C (:func:`install`): SIGTERM (what ``timeout``,
systemd and ``docker stop`` send), SIGHUP (the terminal or the SSH session closed), SIGQUIT (Ctrl-\\), SIGUSR1 and
SIGUSR2 stop a command as Ctrl-C does (a study records what finished and marks nothing left running, a worker gives
its job back, the node's fork servers are released at exit), say so in one line, and the command exits 128 + the
signal's number (143 for SIGTERM), as a shell reports a process that signal ended (:func:`exit_code`). A second
signal, like a second Ctrl-C, stops at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import typer

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TERM_EXIT = 128 + signal.SIGTERM
_terminated = threading.Event()
_first: list[int] = []  # the first stop signal's number


def _as_ctrl_c(signum: int, frame: Any) -> None:
    """Hand a stop signal to whatever handles Ctrl-C now (Python's KeyboardInterrupt, or a study's deferred stop)."""
    if not _terminated.is_set():
        _first.append(signum)
        typer.echo(f"terminated ({signal.Signals(signum).name}): stopping as on Ctrl-C", err=True)
    _terminated.set()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def install() -> None:
    """Handle the stop signals as Ctrl-C from now on in this process (the main thread only: signals are delivered
    there). A signal ignored when the command started (``nohup`` ignores SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _as_ctrl_c)


def terminated() -> bool:
    """Whether a stop signal arrived."""
    return _terminated.is_set()


def exit_code(code: int) -> int:
    """The command's exit code: 128 + the first stop signal's number after one (:data:`TERM_EXIT` for SIGTERM), else
    ``code``."""
    return 128 + _first[0] if _first else code


__all__ = ["STOP_SIGNALS", "TERM_EXIT", "exit_code", "install", "terminated"]
