"""The parallel layout of a trial: how the ranks split the work beside data parallelism, one class for every room.

DeepSpeed 0.19 reads each degree from its own place in the ds_config: Ulysses sequence parallelism from the top-level
``sequence_parallel_size``, AutoTP from ``tensor_parallel.autotp_size``, AutoEP from ``expert_parallel.autoep_size``
(when ``expert_parallel.enabled``), ZeRO++ hpZ from ``zero_optimization.zero_hpz_partition_size`` (a group of ranks
holding a secondary partition, at ZeRO-3 only). Its batch arithmetic counts data-parallel ranks only:
``train_batch_size = micro-batch × accumulation × world / (sp × tp)`` samples per step (``DeepSpeedConfig.world_size``
divides by the sequence-parallel size; a tensor-parallel group trains on one sample). DeepSpeed 0.19.8's own check of
a ``train_batch_size`` under AutoTP counts every rank, so the config DeepSpeed is handed leaves it out
(:meth:`~tuner.workload.trial.TrialConfig.deepspeed_config`). Expert parallelism splits the experts, not the batch.
The groups the degrees make on a cluster are :class:`~tuner.workload.ranks.Ranks`.

Example:
    >>> layout = ParallelLayout.of({"sequence_parallel_size": 2})
    >>> layout.sequence_parallel, layout.data_parallel(8), layout.label()
    (2, 4, 'SP 2')
    >>> layout.data_parallel(3)
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: sequence_parallel_size: sp = 2 must divide the 3 ranks
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from tuner.workload.config_values import read_bool, read_int, section
from tuner.workload.ranks import Ranks


class Kind(Protocol):
    """A layout as :meth:`ParallelLayout.degree` reads it: a :class:`tuner.workload.layouts.LayoutKind`."""

    field: ClassVar[str]


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """Degrees of sequence (Ulysses), tensor (AutoTP) and expert (AutoEP) parallelism and the ZeRO++ hpZ group, as
    the ds_config sets them; 1 is off."""

    sequence_parallel: int = 1
    tensor_parallel: int = 1
    expert_parallel: int = 1
    hpz_partition_size: int = 1

    @classmethod
    def of(cls, ds_config: Mapping[str, Any], zero: bool = True) -> ParallelLayout:
        """Read the degrees out of a ds_config, the hpZ group from its ZeRO section (``zero``: False leaves that
        section unread, hpZ 1: the degrees DeepSpeed's batch keys depend on).

        Raises:
            ConfigError: a degree that is not a positive integer, naming its key.
        """
        hpz_partition_size = 1
        if zero:  # DeepSpeed takes 0 for none
            hpz = read_int(section(ds_config, "zero_optimization"), "zero_hpz_partition_size", 1, "zero_optimization.")
            hpz_partition_size = max(1, hpz)
        tensor = section(ds_config, "tensor_parallel")
        expert = section(ds_config, "expert_parallel")
        expert_on = read_bool(expert, "enabled", False, "expert_parallel.")
        return cls(
            sequence_parallel=read_int(ds_config, "sequence_parallel_size", 1, "", minimum=1),
            tensor_parallel=read_int(tensor, "autotp_size", 1, "tensor_parallel.", minimum=0) or 1,
            expert_parallel=read_int(expert, "autoep_size", 1, "expert_parallel.", minimum=1) if expert_on else 1,
            hpz_partition_size=hpz_partition_size,
        )

    def degree(self, kind: Kind) -> int:
        """The degree of ``kind`` (a layout of :data:`tuner.workload.layouts.LAYOUTS`): how the other rooms read a
        degree, without naming its field."""
        degree: int = getattr(self, kind.field)
        return degree

    @property
    def batch_as_deepspeed_counts(self) -> bool:
        """Whether DeepSpeed 0.19.8's own check of ``train_batch_size`` counts the ranks dstune's batch arithmetic
        counts: not under AutoTP, where it counts every tensor-parallel rank (see the module docstring)."""
        return self.tensor_parallel <= 1

    @staticmethod
    def without_off(ds_config: Mapping[str, Any]) -> dict[str, Any]:
        """``ds_config`` without the degree-1 settings the space writes for "off" that DeepSpeed must not be handed:
        ``tensor_parallel: {autotp_size: 1}`` (any ``autotp_size`` above 0 sets DeepSpeed's AutoTP training mode),
        ``expert_parallel: {autoep_size: 1}`` (AutoEP off without ``enabled``) and ``sequence_parallel_size: 1``
        (DeepSpeed's default)."""
        off = {
            "tensor_parallel": {"autotp_size": 1},
            "expert_parallel": {"autoep_size": 1},
            "sequence_parallel_size": 1,
        }
        return {key: value for key, value in ds_config.items() if key not in off or value != off[key]}

    @property
    def model_parallel(self) -> int:
        """Ranks one sample is spread over (sp × tp): the data-parallel world is the ranks over this."""
        return self.sequence_parallel * self.tensor_parallel

    def ranks(self, world: int, gpus_per_node: int = 0, stage: int = 0, quantized_gradients: bool = False) -> Ranks:
        """The ranks of this layout on ``world`` ranks, ``gpus_per_node`` a node (0: one node), at ZeRO ``stage``
        (DeepSpeed makes hpZ's group, and qgZ's all-to-alls, at ZeRO-3 only): :class:`~tuner.workload.ranks.Ranks`."""
        hpz, qgz = (self.hpz_partition_size, quantized_gradients) if stage == 3 else (1, False)
        sp, tp, ep = self.sequence_parallel, self.tensor_parallel, self.expert_parallel
        return _ranks(world, gpus_per_node, sp, tp, ep, hpz, qgz)

    def data_parallel(self, world_size: int) -> int:
        """Data-parallel ranks of a world of ``world_size``: what DeepSpeed's batch arithmetic counts.

        Raises:
            ConfigError: the layout does not divide the ranks.
        """
        return self.ranks(world_size).checked().data_parallel

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        """The recommender's order, plainest first: by AutoTP degree, then hpZ group, Ulysses and AutoEP degree."""
        return self.tensor_parallel, self.hpz_partition_size, self.sequence_parallel, self.expert_parallel

    def label(self) -> str:
        """``SP 2 · TP 2 · EP 4 · hpZ 8`` for the degrees above 1 (empty for plain data parallelism): the one label
        of a layout, in trial summaries, study tables and the recommender's sentences."""
        parts = [
            f"{label} {degree}"
            for label, degree in (
                ("SP", self.sequence_parallel),
                ("TP", self.tensor_parallel),
                ("EP", self.expert_parallel),
                ("hpZ", self.hpz_partition_size),
            )
            if degree > 1
        ]
        return " · ".join(parts)


_ranks = functools.lru_cache(maxsize=1024)(Ranks)  # one per distinct layout and cluster: a grid resolves thousands


__all__ = ["ParallelLayout"]
