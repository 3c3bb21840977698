"""Ulysses sequence parallelism (with ALST's pieces, :mod:`tuner.workload.long_context`) as a layout: the degree is
the top-level ``sequence_parallel_size``; the rules are :mod:`tuner.workload.long_context_checks`'."""

from __future__ import annotations

from typing import Any

from tuner.workload.config_values import ConfigError
from tuner.workload.layouts.base import LayoutKind
from tuner.workload.long_context import long_context_config
from tuner.workload.long_context_checks import SP_KEY, sequence_parallel_problem
from tuner.workload.spec import Workload
from tuner.workload.trial import TrialConfig


class Ulysses(LayoutKind):
    field = "sequence_parallel"
    key = SP_KEY
    label = "SP"
    flag = "--sequence-parallel"
    help = "Ulysses sequence-parallel degree (sequence_parallel_size)."
    noun = "Ulysses degree"
    description = "Ulysses degree (ds_config sequence_parallel_size)."
    maximum = 2**16
    trainer_applied = True
    memory_saver = True

    def config(self, degree: int) -> dict[str, Any]:
        return long_context_config(degree)

    def problem(self, workload: Workload, degree: int) -> str | None:
        return sequence_parallel_problem(workload, degree)

    def check(self, workload: Workload, trial: TrialConfig) -> None:
        check_long_context(workload, trial)


def check_long_context(workload: Workload, trial: TrialConfig) -> None:
    """Refuse a layout or long-context setting DeepSpeed's Ulysses or ALST cannot run on ``workload``.

    Raises:
        ConfigError: naming the field (:mod:`tuner.workload.long_context_checks`).
    """
    layout, context = trial.layout, trial.long_context
    sp = layout.sequence_parallel
    layout.data_parallel(workload.cluster.world_size)
    problem = sequence_parallel_problem(workload, sp)
    if problem:
        raise ConfigError(SP_KEY, problem)
    local = workload.train.seq_len // sp
    for name, shards in (
        ("tiled_mlp_shards", context.tiled_mlp_shards),
        ("tiled_loss_shards", context.tiled_loss_shards),
    ):
        if shards > local:
            raise ConfigError(f"dstune.{name}", f"{shards} shards exceed the {local} tokens a rank holds")
    if context.offload_checkpoints and not trial.activation_checkpointing:
        raise ConfigError("dstune.offload_checkpoints", "needs activation checkpointing (it offloads the checkpoints)")


ULYSSES = Ulysses()

__all__ = ["ULYSSES", "Ulysses", "check_long_context"]
