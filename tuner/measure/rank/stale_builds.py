"""What a build killed midway leaves in the extensions folder, cleared before a rank loads its ops
(:func:`clear_stale_builds`).

Torch builds an op under a lock file, ``<extensions>/<op>/lock`` (``torch.utils.file_baton.FileBaton``): created
exclusively, kept open while the build runs, removed at its end; every other process waits, polling, for as long as
the file is there. A rank (or the fork server it was forked from) killed while it held the lock leaves the file, and
every later rank of every run waited on it until its run timed out; the build's ``ninja`` and compilers, in the
killed rank's process group, ran on to the end of their work with no one to use it.

So before a rank loads its ops: a lock file that no process holds open (the kernel closes a dead holder's
descriptors, whatever killed it) is removed, and a process working in the extensions folder whose process group's
leader, the rank that started the build, is gone is killed. A live build is left alone: its rank holds the lock and
leads its group. Linux (``/proc``); elsewhere nothing is done.

Example:
    >>> clear_stale_builds(Path("/nonexistent/extensions"))
    (0, 0)
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def _open_paths(pid: str) -> set[str]:
    """The files process ``pid`` holds open (what its descriptors point at)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in (PROC / pid / "fd").iterdir():
            with contextlib.suppress(OSError):
                found.add(os.readlink(fd))
    return found


def _orphaned_builder(pid: str, root: str) -> bool:
    """Whether ``pid`` works in ``root`` (its current folder) and its process group's leader is gone."""
    try:
        cwd = os.readlink(PROC / pid / "cwd")
        group = os.getpgid(int(pid))
    except (OSError, ValueError):
        return False
    if cwd != root and not cwd.startswith(root + os.sep):
        return False
    return not (PROC / str(group)).exists()


def clear_stale_builds(root: Path) -> tuple[int, int]:
    """Remove the build locks under ``root`` that no process holds and kill the orphaned build processes working in
    it; returns (locks removed, processes killed). Cheap when no lock is there: nothing else is looked at."""
    found = root.glob("*/lock") if root.is_dir() and PROC.is_dir() else ()
    locks = {os.path.realpath(path) for path in found}
    if not locks:
        return 0, 0
    real_root, held, killed = os.path.realpath(root), set(), 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or entry.name == str(os.getpid()):
            continue
        held |= locks & _open_paths(entry.name)
        if _orphaned_builder(entry.name, real_root):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    removed = 0
    for lock in locks - held:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
            removed += 1
    return removed, killed


__all__ = ["clear_stale_builds"]
