"""The memory boundary learned from the runs: a config that ran out of memory rules out every config that needs at
least as much, by monotonicity, before it runs.

Config B needs at least as much memory as config A when they agree on everything but knobs that only move memory one
way, and B is on the heavier side of each: a larger micro-batch, a lower ZeRO stage (it partitions less), larger
buckets or more live ZeRO-3 parameters, no activation checkpointing where A had it, and (on GPUs) less offload. So
when A ran out of memory, B would too: it is pruned with the reason (``micro-batch 8 ran out of memory at trial 3;
this config needs at least as much: micro-batch 16``). Anything else that differs (accumulation, precision,
layouts, threads...) makes the two incomparable, and B runs.

Pure logic over ds_configs (:class:`~tuner.workload.TrialConfig`); the loop asks it for studies of a training
command, whose memory the estimator knows only as well as ``--model`` describes the script.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.workload import TrialConfig

CHECKPOINTING = "activation_checkpointing"  # the trial's model setting, beside its ds_config's keys
# knob -> (its words, +1: more memory as it grows, -1: more memory as it shrinks)
MONOTONE: dict[str, tuple[str, int]] = {
    "train_micro_batch_size_per_gpu": ("micro-batch", +1),
    "zero_optimization.stage": ("ZeRO stage", -1),
    "zero_optimization.reduce_bucket_size": ("reduce bucket", +1),
    "zero_optimization.allgather_bucket_size": ("all-gather bucket", +1),
    "zero_optimization.stage3_prefetch_bucket_size": ("ZeRO-3 prefetch bucket", +1),
    "zero_optimization.stage3_max_live_parameters": ("ZeRO-3 live parameters", +1),
    "zero_optimization.stage3_max_reuse_distance": ("ZeRO-3 reuse distance", +1),
    "zero_optimization.stage3_param_persistence_threshold": ("ZeRO-3 persistence threshold", +1),
    CHECKPOINTING: ("activation checkpointing", -1),
}
# offload moves states off the GPU: less of it needs more GPU memory; CPU ranks hold both sides in one memory
OFFLOAD: dict[str, str] = {
    "zero_optimization.offload_optimizer.device": "optimizer offload",
    "zero_optimization.offload_param.device": "parameter offload",
}
OFFLOAD_ORDER = {"nvme": 0, "cpu": 1, "none": 2}  # more device memory needed as the rank grows
DERIVED = frozenset({"train_batch_size"})  # micro × accumulation × data-parallel ranks: follows the others


@dataclass(frozen=True)
class OutOfMemory:
    """A config that ran out of memory, and the trial that ran it."""

    number: int
    trial: TrialConfig


def flat(trial: TrialConfig) -> dict[str, Any]:
    """The trial's ds_config as dotted keys, with its activation checkpointing.

    >>> flat(TrialConfig({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}))
    {'zero_optimization.stage': 2, 'train_micro_batch_size_per_gpu': 4, 'activation_checkpointing': False}
    """
    found: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            found[prefix] = value

    walk("", trial.ds_config)
    found[CHECKPOINTING] = trial.activation_checkpointing
    return found


def _rank(key: str, value: Any, device: str) -> tuple[str, float] | None:
    """(words, how much memory the value needs, on an increasing scale) for a monotone knob, else None."""
    if key in MONOTONE and isinstance(value, (bool, int, float)):
        words, direction = MONOTONE[key]
        return words, direction * float(value)
    if key in OFFLOAD and device != "cpu" and value in OFFLOAD_ORDER:
        return OFFLOAD[key], float(OFFLOAD_ORDER[value])
    return None


def heavier(candidate: TrialConfig, failed: TrialConfig, device: str) -> list[tuple[str, Any, Any]] | None:
    """The knobs on which ``candidate`` needs more memory than ``failed`` (``(words, its value, failed's)``), when
    it needs at least as much on every knob; None when it might need less, or the two are not comparable.

    >>> a = TrialConfig({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8})
    >>> heavier(TrialConfig({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 16}), a, "cpu")
    [('ZeRO stage', 1, 2), ('micro-batch', 16, 8)]
    >>> heavier(TrialConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 16}), a, "cpu")
    """
    mine, theirs = flat(candidate), flat(failed)
    if set(mine) - DERIVED != set(theirs) - DERIVED:
        return None
    more: list[tuple[str, Any, Any]] = []
    for key in sorted(set(mine) - DERIVED, key=list(mine).index):
        if mine[key] == theirs[key]:
            continue
        ours, other = _rank(key, mine[key], device), _rank(key, theirs[key], device)
        if ours is None or other is None or ours[1] < other[1]:
            return None
        more.append((ours[0], mine[key], theirs[key]))
    return more or None


def _words(knobs: list[tuple[str, Any, Any]], index: int) -> str:
    """The knobs with their values: the candidate's (``index`` 1) or the failed config's (2)."""
    return ", ".join(f"{knob[0]} {_value(knob[index])}" for knob in knobs)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else str(value)


def pruned_by_oom(candidate: TrialConfig, failures: Iterable[OutOfMemory], device: str) -> str | None:
    """Why ``candidate`` cannot fit, from the first config that ran out of memory and needs no more than it; None
    when none does.

    >>> failed = OutOfMemory(3, TrialConfig({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 8}))
    >>> pruned_by_oom(TrialConfig({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 16}),
    ...               [failed], "cuda")
    'micro-batch 8 ran out of memory at trial 3; this config needs at least as much: micro-batch 16'
    """
    for failure in failures:
        knobs = heavier(candidate, failure.trial, device)
        if knobs:
            return (
                f"{_words(knobs, 2)} ran out of memory at trial {failure.number}; this config needs at least as "
                f"much: {_words(knobs, 1)}"
            )
    return None
