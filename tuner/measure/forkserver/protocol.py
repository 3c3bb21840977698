"""What a launcher and its node's fork server agree on: which server (a key and its socket), how they talk (one JSON
object a line, each request answered by one line) and how a rank's end reads (``subprocess``'s exit codes).

Requests are ``{"op": "start", ...}`` (fork a rank; answered ``{"pid": PID}``), ``{"op": "poll", "pid": PID}``
(answered ``{"returncode": CODE or null}``), ``{"op": "ping"}`` (answered with the server's pid) and
``{"op": "release"}`` (a session that used the server ended: it leaves once no launcher is connected and no rank
runs, instead of after its idle timeout; answered with its pid); a request the server cannot serve is answered
``{"error": WHY}``.

Example:
    >>> decode(encode({"op": "poll", "pid": 7}))
    {'op': 'poll', 'pid': 7}
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tuner

# Variables read when a process starts or imports (the allocator, the loader, Python, OpenMP/BLAS, DeepSpeed's
# accelerator): a forked rank keeps the server's, so servers are keyed by them. Per-rank variables are not among them.
KEY_VARIABLES = ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR", "LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES")
KEY_PREFIXES = ("PYTHON", "MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
ARGV_ROOM, ENV_ROOM = 2048, 32768  # bytes the server's command line and environment reserve for its ranks' own
ROOM_VARIABLE = "DSTUNE_FORKSERVER_ROOM"


class ForkServerUnavailable(RuntimeError):
    """The node's fork server could not be started or refused to serve (the launcher then spawns ranks)."""


def server_key(env: Mapping[str, str] | None = None) -> str:
    """A short hash of what a preloaded server depends on: the interpreter, the variables read at start-up or import
    (:data:`KEY_VARIABLES`, :data:`KEY_PREFIXES`: a rank asking with other values gets a server started with them),
    and the installed code (dstune's own files' modification times; torch, DeepSpeed and transformers versions)."""
    env = os.environ if env is None else env
    digest = hashlib.sha256(_installed_code().encode())
    for name in sorted(n for n in env if n in KEY_VARIABLES or n.startswith(KEY_PREFIXES)):
        digest.update(f"{name}={env[name]}\n".encode())
    return digest.hexdigest()[:16]


@functools.cache
def _installed_code() -> str:
    """The interpreter and the code this process runs (read once: it does not change under a running launcher,
    and every rank start asks for the key)."""
    from importlib import metadata

    digest = hashlib.sha256(sys.executable.encode())
    for dist in ("torch", "deepspeed", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            digest.update(f"{dist}={metadata.version(dist)}\n".encode())
    package = Path(tuner.__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(f"{path}:{path.stat().st_mtime_ns}\n".encode())
    return digest.hexdigest()


def socket_path(key: str) -> Path:
    """The node's socket for ``key``: a private folder of this user under the temporary folder (short, as Unix
    socket paths must be)."""
    folder = Path(tempfile.gettempdir()) / f"dstune-fork-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    status = folder.lstat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077 or not folder.is_dir() or folder.is_symlink():
        raise ForkServerUnavailable(f"{folder} is not a private folder of this user: ranks are not forked through it")
    return folder / f"{key}.sock"


def socket_inode(path: Path | None) -> int | None:
    """The inode of the socket at ``path`` (which server holds the name), None when there is none."""
    try:
        return None if path is None else path.stat().st_ino
    except OSError:
        return None


def encode(message: dict[str, Any]) -> bytes:
    """One request or answer as the line that carries it."""
    return json.dumps(message).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The request or answer a line carries."""
    message: dict[str, Any] = json.loads(line)
    return message


def exit_code(status: int) -> int:
    """A ``waitpid`` status as ``subprocess.Popen.returncode`` says it (a signal as its negative number)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
