"""DeepSpeed's shared-memory allreduce buffers, removed once a run's ranks are gone.

On CPU ranks DeepSpeed's shm communication op creates one POSIX shared-memory segment per rank,
``/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}`` (66 MiB), and never unlinks it
(``shm.cpp``'s ``shared_close`` is never called): the ranks exit, the segments stay, and since ``/dev/shm`` is memory,
every measured trial takes 66 MiB a rank from the host until it has none. A run's segments are named by its rendezvous
port; they are removed when its ranks have ended, and only those written before then (a later run that was given the
same port keeps its own).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def remove_allreduce_buffers(
    port: int, ranks: Iterable[int] | None = None, before: float | None = None, folder: Path = SHM
) -> list[str]:
    """Remove the segments of the run on ``port`` (of ``ranks``, or of all its ranks) last written before
    ``before`` (default now); the names removed.

    >>> import tempfile
    >>> shm = Path(tempfile.mkdtemp())
    >>> for name in ("127.0.0.1_41000_0", "127.0.0.1_41000_1", "127.0.0.1_41001_0"):
    ...     _ = (shm / f"{PREFIX}_{os.getuid()}_{name}").write_bytes(b"")
    >>> [name[-8:] for name in remove_allreduce_buffers(41000, [1], folder=shm)]
    ['_41000_1']
    """
    cutoff = time.time() if before is None else before
    wanted = None if ranks is None else {str(rank) for rank in ranks}
    removed = []
    for path in sorted(folder.glob(f"{PREFIX}_{os.getuid()}_*_{port}_*")):
        if wanted is not None and path.name.rsplit("_", 1)[-1] not in wanted:
            continue
        with contextlib.suppress(OSError):
            if path.stat().st_mtime <= cutoff:
                path.unlink()
                removed.append(path.name)
    return removed
