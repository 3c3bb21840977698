"""The fork server's life: ``python -m tuner.measure.forkserver SOCKET`` starts it as a daemon that imports what a
rank needs once (:data:`PRELOAD`), checks that a forked child can still use the node's GPUs, freezes what it imported,
listens on the node's socket, serves (:class:`~tuner.measure.forkserver.server.Server`) and leaves when idle.

The server never builds a model, touches a tensor or initialises CUDA (on a GPU node it refuses to serve when a
forked child could not allocate on a GPU: the launcher then spawns fresh ranks).
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from tuner.measure.forkserver.protocol import exit_code, socket_inode
from tuner.measure.forkserver.server import Server, load_built_ops, preload
from tuner.measure.op_builds import use_environment_builds

PRELOAD = (
    "torch",
    "deepspeed",
    "torch._dynamo",  # the compiler stack the first torch.optim optimizer loads
    "deepspeed.runtime.engine",
    "deepspeed.runtime.zero.stage_1_and_2",
    "deepspeed.runtime.zero.stage3",
    "deepspeed.ops.adam",
    "transformers",
    "tuner.measure.rank.runner",
    "tuner.measure.rank.training",
    "tuner.measure.rank.birth",
    "tuner.measure.rank.models",
    "tuner.measure.rank.memory_probe",
    "tuner.measure.rank.lean",
)


def main(argv: list[str] | None = None) -> int:
    """``python -m tuner.measure.forkserver SOCKET``: start the node's server as a daemon (a grandchild, so that no
    launcher's process tree, such as a Ray worker's, takes it down with it) and exit 0 once it listens."""
    path = Path((argv or sys.argv[1:])[0])
    ready_r, ready_w = os.pipe()
    if os.fork():
        os.close(ready_w)
        return 0 if os.read(ready_r, 16) == b"ready" else 3
    os.close(ready_r)
    os.setsid()
    code = 1
    try:
        code = _daemon(path, ready_w)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _forked_child_uses_cuda() -> bool:
    """Whether a child forked now can allocate on a GPU: the self-test of a server on a GPU node, since an import
    that initialised the CUDA driver (not only torch's context) would leave every forked rank unable to."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return exit_code(status) == 0


def _daemon(path: Path, ready: int) -> int:
    """Preload, check that forked ranks can use the GPUs, freeze the imports, listen on ``path`` (``ready`` told),
    serve until idle; the exit code (3: CUDA would be unusable in a forked rank)."""
    started = time.monotonic()
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # torch.cuda.is_available() without initialising the driver
    preload(PRELOAD)
    with contextlib.suppress(Exception):
        from tuner.measure.rank.lean import cache_cpu_info

        cache_cpu_info()
    use_environment_builds()
    load_built_ops()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print("CUDA was initialised while preloading: forked ranks could not use it", file=sys.stderr)
        return 3
    if torch is not None and torch.cuda.device_count() > 0 and not _forked_child_uses_cuda():
        print("a child forked after the imports cannot use CUDA (the driver was initialised)", file=sys.stderr)
        return 3
    gc.collect()
    gc.freeze()  # what the imports made is never garbage: the ranks' collections skip it (tuner.measure.rank.lean)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead server's socket (the starting launcher holds the start lock)
    listener.bind(str(path))
    inode = socket_inode(path)
    listener.listen(64)
    print(f"fork server {os.getpid()} preloaded in {time.monotonic() - started:.1f} s, listening", flush=True)
    os.write(ready, b"ready")
    os.close(ready)
    try:
        Server(listener).serve()
    finally:
        if socket_inode(path) == inode:  # still ours (a launcher retires the socket of a server that stopped answering)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # first: a launcher connecting from now on starts a new server ...
        listener.close()  # ... and one still in the backlog reads EOF and retries
    return 0
