"""The NCCL communicators DeepSpeed 0.19.8 opens on a rank, and the device memory their buffers take (pure
arithmetic; published figures, not yet measured here).

Which communicators: :meth:`tuner.workload.Ranks.communicators`, read in DeepSpeed 0.19.8's code; each
``dist.new_group`` becomes one NCCL communicator on its member ranks, created with ``ncclCommSplit`` once
``init_process_group`` has bound the device, which does not share buffers unless ``splitShare`` is set
[NVIDIA/nccl #986]:

* ``world``: the default process group. dstune's runner synchronises on it (``barrier``, an ``all_reduce`` of a
  flag) and DeepSpeed's checkpoint and consistency checks use it.
* ``data_parallel``: without an mpu, ``groups._get_data_parallel_group()`` returns ``_clone_world_group()``, a
  second communicator over all ranks (``deepspeed/utils/groups.py``); ZeRO reduces gradients and gathers
  parameters on it (``engine.seq_data_parallel_group``).
* ``hpz``: ZeRO++ hierarchical partitioning (``zero_hpz_partition_size`` > 1, stage 3):
  ``_create_zero_param_parallel_group`` makes groups of consecutive ranks (``runtime/zero/stage3.py``,
  ``partition_parameters.py``); the backward all-gathers run inside them.
* ``sequence_parallel`` / ``sequence_data_parallel``: Ulysses (``sequence_parallel_size`` > 1): an all-to-all
  group of consecutive ranks and the group of all ranks ZeRO reduces over; the data-parallel group then has
  ``world / sp`` ranks (strided).
* ``tensor_parallel`` / ``data_parallel``: AutoTP (``tensor_parallel.autotp_size`` > 1): ``_init_tp_mesh_device``
  builds a (dp, tp) device mesh, so tensor-parallel groups of ``tp`` consecutive ranks (the row-parallel all-reduces
  of every layer run on them) and data-parallel groups of ``world / tp`` ranks strided by ``tp`` (ZeRO's).
* ``expert_parallel`` / ``expert_data_parallel``: AutoEP (``expert_parallel.enabled``, ``autoep_size`` > 1):
  ``_create_expert_and_data_parallel`` makes all-to-all groups of ``ep`` consecutive ranks and all-reduce groups of
  ``world / ep`` ranks strided by ``ep``.
* ``quantized_all_to_all``: qgZ (``zero_quantized_gradients``): ``_get_local_all_to_all_group`` makes one group
  per node and one across nodes per local rank.

What each costs (:func:`communicator_bytes`), by transport:

* Collective (ring/tree) buffers within a node: 544 MB for a 2-rank and 688 MB for a larger communicator, measured
  on 4×A100 NVLink with a 4 MB all-reduce on each group [NVIDIA/nccl #964]. They grow with channels, not ranks:
  a ring keeps two connections per channel at any scale, and beyond two nodes memory stops growing [nccl #986]. The
  same figures stand for Hopper (more channels there: an unmeasured underestimate, calibrate).
* NVLink SHARP (Hopper and later on NVSwitch, on by default): ~1 GiB per communicator on NCCL 2.19-2.20, ~256 MiB
  from 2.21 [NVIDIA/nccl-tests #216; NCCL release notes]; counted when the communicator has 2+ ranks on the node.
* Across nodes: ``net_per_communicator`` for the network connections' device buffers (assumption: 8 connections
  — ring send/recv and tree up/down on 2 channels — of Simple 4 MiB + LL128 ~4.69 MiB each, the LL buffers being
  in host memory [NVIDIA/nccl src/transport/net.cc]; no published figure).
* All-to-all (Ulysses, experts, qgZ): point-to-point connections to every peer, up to 32 channels per pair on
  NVLink: 8×H100 went from 1.06 to 4.34 GB at the first ``all_to_all_single``, ~469 MB per NVLink peer
  [NVIDIA/nccl #1685]; ``p2p_net_per_peer`` across nodes is an assumption (2 channels per network peer,
  ``NCCL_NCHANNELS_PER_NET_PEER``, × send and receive × 4 MiB).

NCCL >= 2.22 connects each algorithm at its first collective, so all of this appears in step 1, not at
``init_process_group``. One rank alone opens none of these (DeepSpeed binds no device for a world of one).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.workload import Communicator

MiB = 2**20


@dataclass(frozen=True)
class NcclCosts:
    """Bytes per communicator on one device kind (see the module docstring for the source of each)."""

    pair: int = 544 * 10**6
    larger: int = 688 * 10**6
    nvls: int = 0
    net_per_communicator: int = 8 * (4 * MiB + 4_915_200)
    p2p_nvlink_per_peer: int = (4_340 - 1_060) * 10**6 // 7
    p2p_net_per_peer: int = 2 * 2 * 4 * MiB


def communicator_bytes(group: Communicator, costs: NcclCosts) -> int:
    """Device bytes of one communicator's buffers on a rank (module docstring).

    Example:
        >>> communicator_bytes(Communicator("data_parallel", 8, 8), NcclCosts(nvls=256 * MiB)) // MiB
        912
    """
    if group.size <= 1:
        return 0
    if group.all_to_all:
        return (group.local - 1) * costs.p2p_nvlink_per_peer + (group.size - group.local) * costs.p2p_net_per_peer
    total = costs.pair if group.size == 2 else costs.larger
    if group.local >= 2:
        total += costs.nvls
    if group.size > group.local:
        total += costs.net_per_communicator
    return total


__all__ = ["Communicator", "NcclCosts", "communicator_bytes"]
