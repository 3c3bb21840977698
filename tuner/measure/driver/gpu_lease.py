"""Which of this node's GPUs a local run's ranks see: concurrent runs under the local launcher get disjoint sets.

The dispatcher runs ``GPUs // world size`` CUDA runs at once on a node. Each run leases ``gpus_per_node`` of the
node's devices for as long as it lasts and its ranks start with ``CUDA_VISIBLE_DEVICES`` naming them (every rank of
the run sees all of them and picks its own by ``LOCAL_RANK``, as under the Ray launcher), so two runs of 4 ranks on an
8-GPU node use GPUs 0-3 and 4-7, not 0-3 both. The node's devices are this process's ``CUDA_VISIBLE_DEVICES``
entries as written (indices, ``GPU-…`` UUIDs or ``MIG-…`` instances), else ``0 .. device_count - 1``.

Example:
    >>> leases = DeviceLeases(["0", "1", "2", "3"])
    >>> with leases.lease(2) as first, leases.lease(2) as second:
    ...     first, second
    (('0', '1'), ('2', '3'))
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager


class TooFewDevices(Exception):
    """A run needs more GPUs than the node has (``kind``: the measurement's ``exception_type``)."""

    def __init__(self, message: str, kind: str = "ResourcesUnavailable") -> None:
        super().__init__(message)
        self.kind = kind


class DeviceLeases:
    """The node's GPUs, each held by at most one run at a time (thread-safe: the dispatcher's runs are threads)."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = tuple(devices)
        self._free = list(self.devices)
        self._changed = threading.Condition()

    @contextmanager
    def lease(self, count: int, cancel: threading.Event | None = None) -> Iterator[tuple[str, ...]]:
        """Hold ``count`` free devices while the block runs, waiting for a run to give some back (or ``cancel``)."""
        if count > len(self.devices):
            raise TooFewDevices(f"the run needs {count} GPUs; this node has {len(self.devices)}: {self.devices}")
        with self._changed:
            while len(self._free) < count:
                if cancel is not None and cancel.is_set():
                    raise TooFewDevices("cancelled while waiting for GPUs")
                self._changed.wait(0.5)
            taken = tuple(self._free[:count])
            del self._free[:count]
        try:
            yield taken
        finally:
            with self._changed:
                self._free.extend(taken)
                self._free.sort(key=self.devices.index)
                self._changed.notify_all()


def node_devices(environ: Mapping[str, str] = os.environ) -> list[str]:
    """This node's GPUs as a rank's ``CUDA_VISIBLE_DEVICES`` may name them."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


_leases: DeviceLeases | None = None
_made = threading.Lock()


def node_leases() -> DeviceLeases:
    """The one lease book of this process's node (made on first use from :func:`node_devices`)."""
    global _leases
    with _made:
        if _leases is None:
            _leases = DeviceLeases(node_devices())
        return _leases
