"""The forked child's side: leave the fork server behind and become the rank a launcher would have started.

A new session (the launcher kills its process group), ``PR_SET_PDEATHSIG`` tied to the server, the rank's
environment, working folder, log and address-space limit, a command line and environment that say the rank's own
(``ps``, ``psutil``), then the entry's module or script run as ``__main__``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1
STAT_ARG_START = 48  # /proc/self/stat's fields (proc(5)): where the command line and the environment lie


def run_rank(
    message: dict[str, Any], argv: list[str], inherited: Sequence[socket.socket], selector: selectors.BaseSelector
) -> NoReturn:
    """In the child just forked for a ``start`` request: become the rank, run its entry and exit with its code."""
    code = 1
    try:
        become_rank(message, inherited, selector)
        code = run_entry(argv)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def become_rank(message: dict[str, Any], inherited: Sequence[socket.socket], selector: selectors.BaseSelector) -> None:
    """Leave the server's sockets (``inherited``, ``selector``), session and signals behind and take on the rank's
    process."""
    server_pid = os.getppid()
    for conn in inherited:
        conn.close()
    selector.close()
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before the death signal was armed
        os._exit(1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    if message.get("memory_cap"):
        cap = int(message["memory_cap"])
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    os.chdir(message["cwd"])
    os.environ.clear()  # no libc pointer into the inherited environment's memory is left ...
    os.environ.update(message["env"])
    retitle(message["argv"], message["env"])  # ... so it can say the rank's own
    sink = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)
    os.close(null)


def retitle(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make ``/proc/self/cmdline`` and ``/proc/self/environ`` (what ``ps``, ``psutil`` and an operator see) say this
    rank's command and environment instead of the server's, by writing them over the server's own, which the
    starter padded (``ARGV_ROOM``, ``ENV_ROOM`` of :mod:`tuner.measure.forkserver.protocol`); what does not fit is
    left out of that view only."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # fields from the third on
    arg_start, arg_end, env_start, env_end = (int(fields[STAT_ARG_START - 3 + i]) for i in range(4))
    _overwrite(arg_start, arg_end, [arg.encode() for arg in argv])
    _overwrite(env_start, env_end, [f"{key}={value}".encode() for key, value in env.items()])


def _overwrite(start: int, end: int, items: list[bytes]) -> None:
    room = end - start
    data = b""
    for item in items:
        if len(data) + len(item) + 2 > room:
            break
        data += item + b"\0"
    ctypes.memmove(start, data.ljust(room, b"\0"), room)


def run_entry(argv: list[str]) -> int:
    """Run ``python -m MODULE ARGS``, ``python -c CODE ARGS`` or ``python SCRIPT ARGS`` in this process as
    ``__main__``; its exit code."""
    import runpy
    import warnings

    try:
        if argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            sys.path[0] = os.getcwd()
            with warnings.catch_warnings():  # the module was preloaded: running it again as __main__ is the point
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        elif argv[1] == "-c":
            sys.argv = ["-c", *argv[3:]]
            sys.path[0] = ""
            exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = argv[1:]
            sys.path[0] = str(Path(argv[1]).resolve().parent)
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0
