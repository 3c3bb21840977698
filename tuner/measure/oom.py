"""Is a rank's death an out-of-memory? Read from the exception it raised, or from how its process ended (pure).

A GPU runs out of memory in more ways than ``torch.OutOfMemoryError`` (the caching allocator's own). Each of these is
the same fact, the config's memory, and a study must learn it as ``oom`` to bracket the boundary:

- the caching allocator: ``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError`` ("CUDA out of memory. Tried to
  allocate ..."), the CPU allocator's "DefaultCPUAllocator: can't allocate memory" and Python's ``MemoryError``;
- NCCL allocating its buffers lazily, at a communicator's first collective (NCCL >= 2.22), outside the allocator:
  ``ncclUnhandledCudaError`` / ``DistBackendError`` with "Cuda failure 'out of memory'" or
  "Failed to CUDA calloc";
- cuBLAS / cuDNN / cuSOLVER creating a handle or workspace: ``CUBLAS_STATUS_ALLOC_FAILED``,
  ``CUDNN_STATUS_ALLOC_FAILED``, ``CUSOLVER_STATUS_ALLOC_FAILED``;
- the CUDA runtime or driver itself: "CUDA error: out of memory", ``cudaErrorMemoryAllocation``,
  ``CUDA_ERROR_OUT_OF_MEMORY``;
- the process group's watchdog aborting the rank on one of these (its message carries the CUDA or NCCL error);
- the host's OOM killer: the rank dies of SIGKILL (exit -9, or 137 through a shell) that nobody else sent, and the
  kernel counted an OOM kill in the rank's memory cgroup (``memory.events``' ``oom_kill``) meanwhile.

A rank whose collective broke because a peer died (the watchdog's timeout, a remote error, a closed connection)
:func:`follows_peer`: the peer is the cause, and the run takes the peer's status.

Example:
    >>> oom_message("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    True
    >>> exit_status(-9, oom_kills=1), exit_status(-9, oom_kills=0), exit_status(1, "CUDA error: out of memory")
    ('oom', 'error', 'oom')
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

OOM_TYPES = frozenset({"OutOfMemoryError", "MemoryError"})  # torch.OutOfMemoryError, torch.cuda's alias, Python's
_OOM = re.compile(
    "|".join(
        (
            r"CUDA out of memory",
            r"DefaultCPUAllocator: can't allocate memory",
            r"CUDA error: out of memory",
            r"CUDA driver error: out of memory",
            r"Cuda failure \d*\s*'out of memory'",  # NCCL's CUDACHECK of a cudaMalloc/cuMemCreate
            r"Failed to CUDA (?:calloc|malloc|host alloc)",  # NCCL's ncclCudaCalloc (include/alloc.h)
            r"cuMem\w* failed with error 2\b",  # NCCL's CUCHECK: CUDA_ERROR_OUT_OF_MEMORY is 2
            r"CUDA_ERROR_OUT_OF_MEMORY",
            r"cudaErrorMemoryAllocation",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            r"CUBLASLT_STATUS_ALLOC_FAILED",
            r"CUDNN_STATUS_ALLOC_FAILED",
            r"CUSOLVER_STATUS_ALLOC_FAILED",
            r"CUFFT_ALLOC_FAILED",
        )
    )
)
# what an exception of a user's script says beyond the runtime's own wording (its libraries wrap and reword it):
# read for training commands, whose exceptions dstune did not raise (tuner.measure.script.failures)
_OOM_WORDED = re.compile(
    r"out of memory|Failed to allocate|ncclSystemError.*(?:alloc|memory)|CUDNN_STATUS_NOT_INITIALIZED", re.IGNORECASE
)
# a rank's own collective broke because a peer went away: the effect, never the cause
_PEER = re.compile(
    "|".join(
        (
            r"Watchdog caught collective operation timeout",
            r"ncclRemoteError",
            r"remote process exited or there was a network error",
            r"Connection reset by peer",
            r"Connection closed by peer",
            r"Some NCCL operations have failed or timed out",
            r"Gloo connectFullMesh failed",
        )
    )
)
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


def oom_error(exception_type: str, message: str) -> bool:
    """True when an exception (its class name, qualified or not, and its text) is an out-of-memory of any kind.

    >>> oom_error("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2 GiB"), oom_error("KeyError", "")
    (True, False)
    """
    return exception_type.rsplit(".", 1)[-1] in OOM_TYPES or oom_message(message)


def oom_message(text: str) -> bool:
    """True when ``text`` (an exception's message, a rank's log tail) reports an allocation that failed."""
    return _OOM.search(text) is not None


def oom_worded(exception_type: str, message: str) -> bool:
    """:func:`oom_error`, or the looser words a user's libraries put an out-of-memory in ("out of memory" in any
    case, "Failed to allocate", an NCCL system error about memory, cuDNN failing to start for want of it).

    >>> oom_worded("RuntimeError", "Failed to allocate 2048 bytes"), oom_error("RuntimeError", "Failed to allocate")
    (True, False)
    """
    return oom_error(exception_type, message) or _OOM_WORDED.search(message) is not None


def follows_peer(text: str) -> bool:
    """True when ``text`` says the rank's collective broke because a peer went away (and no OOM of its own)."""
    return _PEER.search(text) is not None and not oom_message(text)


def exit_status(returncode: int | None, log_tail: str = "", oom_kills: int = 0) -> str:
    """``oom`` or ``error`` for a rank that exited without a report, from its exit and the end of its log.

    ``oom_kills``: how many OOM kills the kernel counted in the rank's memory cgroup while the run lasted
    (:func:`cgroup_oom_kills` before and after). A SIGKILL the launcher did not send is the host's OOM killer only
    when the kernel counted one; otherwise it is someone's ``kill -9`` and stays ``error``.
    """
    if returncode in KILLED and oom_kills > 0:
        return "oom"
    return "oom" if oom_message(log_tail) else "error"


def cgroup_oom_kills(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (cgroup v2 ``memory.events`` ``oom_kill``,
    hierarchical: a rank's child cgroup counts too), or None where it cannot be read (cgroup v1, no such file)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    try:
        events = (root / path.lstrip("/") / "memory.events").read_text()
    except OSError:
        return None
    for line in events.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def kills_between(before: int | None, after: int | None) -> int:
    """OOM kills counted between two :func:`cgroup_oom_kills` readings (0 when either was unreadable).

    >>> kills_between(3, 5), kills_between(None, 5)
    (2, 0)
    """
    return max(0, after - before) if before is not None and after is not None else 0
