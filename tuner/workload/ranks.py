"""One description of the ranks: from a layout's degrees and the cluster, every group DeepSpeed 0.19.8 makes, its
size and members, the communicators a rank joins, and a rank's place in each group (pure Python).

How DeepSpeed 0.19.8 groups the ranks (read in its code; ranks fill nodes in order):

* ``sequence_parallel``: Ulysses (``sequence_parallel_size`` = sp): all-to-all groups of sp consecutive ranks; ZeRO
  partitions and reduces over every rank (``seq_data_parallel``, sp × dp); the data-parallel group is the
  world / sp ranks strided by sp.
* ``tensor_parallel``: AutoTP (``tensor_parallel.autotp_size`` = tp): ``_init_tp_mesh_device`` builds a (dp, tp)
  mesh, so groups of tp consecutive ranks and data-parallel groups of world / tp ranks strided by tp, over which
  ZeRO partitions the model states.
* ``expert_parallel``: AutoEP (``expert_parallel.autoep_size`` = ep): ``_create_expert_and_data_parallel`` makes
  all-to-all groups of ep consecutive ranks and expert-data-parallel groups of world / ep ranks strided by ep, over
  which ZeRO partitions the experts.
* ``hpz``: ZeRO++ hierarchical partitioning at ZeRO-3 (``zero_hpz_partition_size`` = g): groups of g consecutive
  ranks hold the secondary partition.
* ``quantized_all_to_all``: qgZ at ZeRO-3: one all-to-all group per node and one across nodes per local rank.

DeepSpeed's batch arithmetic counts the data-parallel ranks, world / (sp × tp): a sequence- or tensor-parallel group
trains on one sample.

Example:
    >>> ranks = Ranks(world=16, gpus_per_node=8, tensor=4)
    >>> ranks.data_parallel, ranks.zero_partition, ranks.members("data_parallel", 5)
    (4, 4, (1, 5, 9, 13))
    >>> [(c.name, c.size, c.local) for c in ranks.communicators()]
    [('world', 16, 8), ('tensor_parallel', 4, 4), ('data_parallel', 4, 2)]
    >>> ranks.place(6)
    RankPlace(data_parallel=1, sequence_parallel=0, tensor_parallel=2, expert_parallel=0)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tuner.workload.config_values import ConfigError


@dataclass(frozen=True, slots=True)
class Communicator:
    """One group a rank belongs to: ``size`` ranks, ``local`` of them on the rank's node, spaced ``stride`` apart
    (1: consecutive ranks), all-to-all (point-to-point connections to every peer) or collective."""

    name: str
    size: int
    local: int
    all_to_all: bool = False
    stride: int = 1


@dataclass(frozen=True, slots=True)
class RankPlace:
    """A rank's index in each of its groups: which data-parallel replica (its data feeder), and its rank within its
    sequence-, tensor- and expert-parallel groups."""

    data_parallel: int
    sequence_parallel: int
    tensor_parallel: int
    expert_parallel: int


@dataclass(frozen=True, slots=True)
class Ranks:
    """The ranks of one trial on one cluster: the world, the GPUs a node holds (0: one node holds them all) and the
    degree of each group (1: off). ``hpz`` and ``quantized_gradients`` count at ZeRO-3 only: the caller passes them
    as the stage leaves them (:meth:`tuner.workload.ParallelLayout.ranks`)."""

    world: int
    gpus_per_node: int = 0
    sequence: int = 1
    tensor: int = 1
    expert: int = 1
    hpz: int = 1
    quantized_gradients: bool = False
    zero_partition: int = field(init=False, compare=False, repr=False)
    """Ranks ZeRO partitions the (dense) model states over: every rank under Ulysses (``seq_dp_world_size`` is
    sp × dp), world / tp under AutoTP (the mesh's data-parallel group). Kept, not computed: the estimator reads it
    many times an estimate."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "zero_partition", self.world // max(1, self.tensor))

    @property
    def per_node(self) -> int:
        """Ranks on one node."""
        return self.gpus_per_node or self.world

    @property
    def model_parallel(self) -> int:
        """Ranks one sample is spread over (sp × tp)."""
        return self.sequence * self.tensor

    @property
    def data_parallel(self) -> int:
        """Data-parallel ranks (world over sp × tp, at least 1): what DeepSpeed's batch arithmetic counts."""
        return max(1, self.world // self.model_parallel)

    @property
    def expert_data_parallel(self) -> int:
        """Ranks ZeRO partitions the experts over: the expert-data-parallel group, world / ep."""
        return max(1, self.world // max(1, self.expert))

    @property
    def deepspeed_world(self) -> int:
        """The ranks DeepSpeed 0.19.8's batch check counts without an mpu: the world over sp (``DeepSpeedConfig``
        divides by ``sequence_parallel_size``; tensor-parallel ranks count, see :mod:`tuner.workload.layout`)."""
        return self.world // self.sequence

    def checked(self) -> Ranks:
        """These ranks, once the sequence- and tensor-parallel groups divide the world.

        Raises:
            ConfigError: sp × tp does not divide the world, naming the degree's key.
        """
        if self.world % self.model_parallel:
            field = "sequence_parallel_size" if self.sequence > 1 else "tensor_parallel.autotp_size"
            raise ConfigError(field, f"{self.model_parallel_degrees()} must divide the {self.world} ranks")
        return self

    def model_parallel_degrees(self) -> str:
        """The model-parallel degrees as given: ``sp = 2``, ``tp = 3``, or ``sp × tp = 2 × 3 = 6`` with both.

        >>> Ranks(8, sequence=2, tensor=3).model_parallel_degrees(), Ranks(8, tensor=3).model_parallel_degrees()
        ('sp × tp = 2 × 3 = 6', 'tp = 3')
        """
        if self.sequence > 1 and self.tensor > 1:
            return f"sp × tp = {self.sequence} × {self.tensor} = {self.model_parallel}"
        return f"sp = {self.sequence}" if self.sequence > 1 else f"tp = {self.tensor}"

    def place(self, rank: int) -> RankPlace:
        """``rank``'s index in each group: sequence- and tensor-parallel groups are consecutive ranks, so the
        data-parallel index is the rank over sp × tp; expert groups are ep consecutive ranks."""
        return RankPlace(
            data_parallel=rank // self.model_parallel,
            sequence_parallel=rank % self.sequence,
            tensor_parallel=rank % self.tensor,
            expert_parallel=rank % self.expert,
        )

    def communicators(self) -> tuple[Communicator, ...]:
        """The groups one rank belongs to, each one NCCL communicator (``dist.new_group``), size-1 groups left out
        (none for a world of one: DeepSpeed binds no device)."""
        return _communicators(self)

    def members(self, name: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group called ``name`` (one of :meth:`communicators`' names).

        Raises:
            KeyError: no such group in these ranks.
        """
        group = next((c for c in self.communicators() if c.name == name), None)
        if group is None:
            raise KeyError(name)
        if name == "quantized_all_to_all_global":  # one rank per node, at the rank's local index
            return tuple(rank % self.per_node + node * self.per_node for node in range(group.size))
        span = group.size * group.stride  # the block of ranks the group's members lie in
        first = rank // span * span + rank % group.stride
        return tuple(first + index * group.stride for index in range(group.size))


def _consecutive(name: str, size: int, per_node: int, all_to_all: bool = False) -> Communicator:
    """A group of ``size`` consecutive ranks: ``min(size, per_node)`` of them on the rank's node."""
    return Communicator(name, size, min(size, per_node), all_to_all)


def _strided(name: str, size: int, stride: int, per_node: int) -> Communicator:
    """A group of ``size`` ranks spaced ``stride`` apart."""
    local = max(1, min(size, per_node // stride)) if stride <= per_node else 1
    return Communicator(name, size, local, stride=stride)


@functools.lru_cache(maxsize=256)
def _communicators(r: Ranks) -> tuple[Communicator, ...]:
    if r.world <= 1:
        return ()
    world, gpn = r.world, r.per_node
    groups = [_consecutive("world", world, gpn)]
    sp = r.sequence if world % r.sequence == 0 else 1
    tp = r.tensor if world % r.tensor == 0 else 1
    if sp > 1:
        groups.append(_consecutive("sequence_parallel", sp, gpn, all_to_all=True))
        groups.append(_consecutive("sequence_data_parallel", world, gpn))
        groups.append(_strided("data_parallel", world // sp, sp, gpn))
    elif tp > 1:
        groups.append(_consecutive("tensor_parallel", tp, gpn))
        groups.append(_strided("data_parallel", world // tp, tp, gpn))
    else:
        groups.append(_consecutive("data_parallel", world, gpn))
    if r.hpz > 1:
        groups.append(_consecutive("hpz", min(r.hpz, world), gpn))
    ep = r.expert
    if ep > 1 and world % ep == 0:
        groups.append(_consecutive("expert_parallel", ep, gpn, all_to_all=True))
        groups.append(_strided("expert_data_parallel", world // ep, ep, gpn))
    if r.quantized_gradients:
        local = min(gpn, world)
        groups.append(_consecutive("quantized_all_to_all_local", local, local, all_to_all=True))
        groups.append(Communicator("quantized_all_to_all_global", max(1, world // gpn), 1, True, stride=gpn))
    return tuple(group for group in groups if group.size > 1)


__all__ = ["Communicator", "RankPlace", "Ranks"]
