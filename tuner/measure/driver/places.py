"""Where one rank of a job runs and the distributed environment it starts with: torchrun's variables
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``),
here and on Ray alike, and the rendezvous port.

On this machine a ``--gpus G --nodes M`` layout is emulated on CPU ranks (:func:`local_places`: rank r is local rank
r mod G of node r div G).

Example:
    >>> [(place.rank, place.node_rank, place.local_rank) for place in local_places(2, 2)]
    [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    >>> RankPlace(1, 2, local_rank=1, local_world_size=2).env("127.0.0.1", 29500)["LOCAL_RANK"]
    '1'
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_taken(error: str) -> bool:
    """True when a run failed because its rendezvous port was taken between :func:`free_port` and rank 0's bind
    (torch's TCPStore: ``EADDRINUSE``): another process's luck, not the config's; the run is started again on a new
    port.

    >>> port_taken("The server socket has failed to listen on any local network address. port: 29500, useIpv6: "
    ...            "false, code: -98, name: EADDRINUSE, message: address already in use")
    True
    """
    return "EADDRINUSE" in error or "address already in use" in error.lower()


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a job runs: its global rank, its node, and its index among the job's ranks on that node.

    ``visible_devices`` is the node's ``CUDA_VISIBLE_DEVICES`` for the job (every rank of a node sees all the node's
    GPUs the job holds and picks its own by ``local_rank``); None leaves the variable as the process found it.
    """

    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    node_id: str | None = None
    hostname: str | None = None
    visible_devices: str | None = None

    def env(self, master_addr: str, master_port: int) -> dict[str, str]:
        """The rank's distributed environment (torchrun's names)."""
        env = {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
        }
        if self.visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        return env


def local_places(gpus_per_node: int, nodes: int, visible: str | None = None) -> list[RankPlace]:
    """The layout ``nodes`` × ``gpus_per_node`` on this machine: rank r is local rank r mod G of node r div G;
    ``visible``: the run's ``CUDA_VISIBLE_DEVICES`` (None: as this process has it)."""
    world, host = gpus_per_node * nodes, socket.gethostname()
    return [
        RankPlace(r, world, r % gpus_per_node, gpus_per_node, r // gpus_per_node, None, host, visible)
        for r in range(world)
    ]
