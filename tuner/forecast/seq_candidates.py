"""The configs a search for the longest sequence considers (:mod:`tuner.forecast.longest`): one
:class:`Candidate` per layout and memory-saving setting, the ones a user pinned (:class:`Pins`) held fixed.

Searched when not pinned: the ZeRO stage (0-3), optimizer offload (none, cpu; stages 1-3), parameter offload (none,
cpu; ZeRO-3), activation checkpointing, the Ulysses degree ``sp`` (the divisors of the ranks that divide the
attention heads), ALST's tiled MLP and tiled loss (off, or :data:`AUTO`) and checkpoint offload (with
checkpointing). The micro-batch is 1 unless pinned. NVMe offload is considered only when pinned (it needs a path).

A candidate makes its trial config at each length (:meth:`Candidate.trial`): the shortcut fields' ds_config (as
``dstune estimate`` builds it), ``sequence_parallel_size`` and the ``dstune`` section's ``tiled_mlp_shards``,
``tiled_loss_shards`` and ``offload_checkpoints`` (:func:`tuner.workload.long_context_config`: Ulysses' and ALST's
keys), and the user's ds_config merged over it (it wins: a stage it sets is pinned by it). :data:`AUTO` shards
follow ALST's choices at each length: the tiled MLP in shards of about the hidden size in tokens, the loss in shards
of at most 1 GiB of fp32 logits. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from tuner.space.dsconfig import merge_configs, shortcut_config
from tuner.workload import ModelSpec, TrialConfig, Workload, long_context_config
from tuner.workload.layouts import ULYSSES

SEQ_MULTIPLE = 256  # the answer's granularity: lengths are multiples of this (and of what the layout requires)
AUTO = 0  # tiled shards chosen at each length (module docstring)
LOSS_SHARD_BYTES = 2**30  # fp32 logits per loss shard under AUTO


@dataclass(frozen=True)
class Pins:
    """What the user fixed; None: searched. ``sp``: the Ulysses degree (:data:`~tuner.workload.layouts.ULYSSES`).
    ``ds_config`` is merged over every candidate's config (it wins)."""

    stage: int | None = None
    offload_optimizer: str | None = None
    offload_param: str | None = None
    activation_checkpointing: bool | None = None
    micro_batch: int = 1
    sp: int | None = None
    tiled_mlp_shards: int | None = None
    tiled_loss_shards: int | None = None
    offload_checkpoints: bool | None = None
    ds_config: Mapping[str, Any] | None = field(default=None, compare=False)
    nvme_path: str | None = None


@dataclass(frozen=True)
class Candidate:
    """One layout and set of memory-saving settings: ``sp`` the Ulysses degree, ``tiled_*`` 1 off, :data:`AUTO` per
    length."""

    stage: int
    offload_optimizer: str
    offload_param: str
    activation_checkpointing: bool
    sp: int
    tiled_mlp: int
    tiled_loss: int
    offload_checkpoints: bool
    micro_batch: int = 1

    @property
    def multiple(self) -> int:
        """Lengths this candidate is tried at are multiples of this: :data:`SEQ_MULTIPLE` and the sp degree (Ulysses
        splits the sequence evenly over its ranks)."""
        return math.lcm(SEQ_MULTIPLE, self.sp)

    @property
    def offloads(self) -> int:
        """How many things go to host memory (fewer is simpler and faster)."""
        return sum((self.offload_optimizer != "none", self.offload_param != "none", self.offload_checkpoints))

    @property
    def features(self) -> int:
        """How many memory savers are on (checkpointing, tiled MLP, tiled loss)."""
        return sum((self.activation_checkpointing, self.tiled_mlp != 1, self.tiled_loss != 1))

    def shards(self, model: ModelSpec, seq_len: int) -> tuple[int, int]:
        """(MLP shards, loss shards) at ``seq_len`` tokens (:data:`AUTO` resolved)."""
        local = max(1, seq_len // self.sp)
        mlp, loss = self.tiled_mlp, self.tiled_loss
        if mlp == AUTO:
            mlp = max(1, -(-local // max(1, model.hidden_size)))
        if loss == AUTO:
            loss = max(1, -(-4 * local * max(1, model.vocab_size) // LOSS_SHARD_BYTES))
        return mlp, loss

    def trial(self, workload: Workload, seq_len: int, pins: Pins) -> TrialConfig:
        """The trial config at ``seq_len`` tokens (the user's ds_config merged over it)."""
        config = shortcut_config(
            self.micro_batch,
            1,
            workload.train.precision,
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            pins.nvme_path,
        )
        mlp, loss = self.shards(workload.model, seq_len)
        config = merge_configs(config, long_context_config(self.sp, mlp, loss, self.offload_checkpoints))
        if pins.ds_config:
            config = merge_configs(config, dict(pins.ds_config))
        return TrialConfig(config, self.activation_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        """Its fields in order, the Ulysses degree under its registry field (a length study's settings)."""
        return {ULYSSES.field if name == "sp" else name: value for name, value in self.__dict__.items()}


def sp_degrees(workload: Workload) -> tuple[int, ...]:
    """The Ulysses degrees worth trying: divisors of the ranks that divide the attention heads (1 alone for a bare
    parameter count: no heads known). Which of them the estimator accepts (key-value heads...) it says itself."""
    world, heads = workload.cluster.world_size, workload.model.num_heads
    if workload.model.is_bare or heads <= 0:
        return (1,)
    return tuple(d for d in range(1, world + 1) if world % d == 0 and heads % d == 0)


def _choices(pinned: Any, searched: tuple[Any, ...]) -> tuple[Any, ...]:
    return searched if pinned is None else (pinned,)


def candidates(workload: Workload, pins: Pins) -> Iterator[Candidate]:
    """Every candidate the pins allow, the most memory-saving first (so a long incumbent comes early and prunes the
    rest). Combinations DeepSpeed refuses (optimizer offload at ZeRO-0, parameter offload below ZeRO-3, checkpoint
    offload without checkpointing) are left out unless pinned: the estimator then refuses them, naming the key."""
    tiling = (1,) if workload.model.is_bare else (AUTO, 1)
    grid = product(
        _choices(pins.sp, tuple(reversed(sp_degrees(workload)))),
        _choices(pins.stage, (3, 2, 1, 0)),
        _choices(pins.offload_param, ("cpu", "none")),
        _choices(pins.offload_optimizer, ("cpu", "none")),
        _choices(pins.activation_checkpointing, (True, False)),
        _choices(pins.offload_checkpoints, (True, False)),
        _choices(pins.tiled_mlp_shards, tiling),
        _choices(pins.tiled_loss_shards, tiling),
    )
    for sp, stage, param, optimizer, checkpointing, offload_ckpt, mlp, loss in grid:
        if pins.offload_optimizer is None and optimizer != "none" and stage == 0:
            continue
        if pins.offload_param is None and param != "none" and stage != 3:
            continue
        if pins.offload_checkpoints is None and offload_ckpt and not checkpointing:
            continue
        yield Candidate(stage, optimizer, param, checkpointing, sp, mlp, loss, offload_ckpt, pins.micro_batch)


__all__ = ["AUTO", "SEQ_MULTIPLE", "Candidate", "Pins", "candidates", "sp_degrees"]
