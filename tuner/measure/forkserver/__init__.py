"""Rank processes forked from a per-node server that imported torch, DeepSpeed and the runner once.

A fresh rank spends seconds importing torch, DeepSpeed, transformers and torch's compiler stack before it measures
anything (``imports_s`` in a trial's cost breakdown). A fork server pays that once per node: the first launcher on a
node starts ``python -m tuner.measure.forkserver SOCKET`` detached (:mod:`~tuner.measure.forkserver.daemon`), the
server imports everything a rank needs (plus the modelling module a run names), moves what it imported to the
collector's permanent generation, and then forks one child per rank it is asked for
(:mod:`~tuner.measure.forkserver.server`). Each child becomes the rank the launcher would have started
(:mod:`~tuner.measure.rank.forked`).

Nothing of one run reaches the next: the server never builds a model, touches a tensor or initialises CUDA, and every
rank is a fresh fork of that pristine process, so one trial's allocations, process group or engine never exist in the
next one's rank.

Launchers (the local one, and Ray's rank hosts on every node) share the node's server through a Unix socket under
the temporary folder, named by a key of the interpreter, the environment read at start-up (``PYTHONPATH``, the
allocator's and OpenMP's variables, ``LD_PRELOAD``, the accelerator...: a forked rank keeps the server's) and the
installed code (a changed dstune, torch or DeepSpeed gets a new server): :mod:`~tuner.measure.forkserver.protocol`.
What a launcher holds, and how it tells a lost server from a failed rank: :mod:`~tuner.measure.forkserver.client`.

May import: the standard library, :mod:`tuner.env`, :mod:`tuner.measure.op_builds`, the forked child's side
(:mod:`tuner.measure.rank.forked`; torch and DeepSpeed only in the server, to preload them).
"""

from tuner.measure.forkserver.client import (
    ForkClient,
    ForkedProcess,
    forget_client,
    node_client,
    release_node_servers,
)
from tuner.measure.forkserver.protocol import ForkServerUnavailable, server_key, socket_path

__all__ = [
    "ForkClient",
    "ForkServerUnavailable",
    "ForkedProcess",
    "forget_client",
    "node_client",
    "release_node_servers",
    "server_key",
    "socket_path",
]
