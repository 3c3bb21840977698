"""The workload's vocabularies, each declared once as a ``Literal`` type (Typer makes choices of them, pydantic the
OpenAPI schema's ``enum`` lists) with the tuple of its values (what the specs check at run time).

Example:
    >>> PRECISIONS, MODEL_IMPLS
    (('bf16', 'fp16', 'fp32'), ('transformers', 'builtin'))
"""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["bf16", "fp16", "fp32"]
Attention = Literal["sdpa", "flash", "eager"]
Optimizer = Literal["adam", "adamw"]
Device = Literal["cuda", "cpu"]
ModelImpl = Literal["transformers", "builtin"]  # the model measured runs train: transformers', or dstune's built-in
LauncherEnv = Literal["deepspeed", "torchrun", "accelerate"]  # whose rules give ranks their threads (launch_env)

PRECISIONS: tuple[str, ...] = get_args(Precision)
ATTENTION_KINDS: tuple[str, ...] = get_args(Attention)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
DEVICES: tuple[str, ...] = get_args(Device)
MODEL_IMPLS: tuple[str, ...] = get_args(ModelImpl)
LAUNCHER_ENVS: tuple[str, ...] = get_args(LauncherEnv)

__all__ = [
    "ATTENTION_KINDS",
    "DEVICES",
    "LAUNCHER_ENVS",
    "MODEL_IMPLS",
    "OPTIMIZERS",
    "PRECISIONS",
    "Attention",
    "Device",
    "LauncherEnv",
    "ModelImpl",
    "Optimizer",
    "Precision",
]
