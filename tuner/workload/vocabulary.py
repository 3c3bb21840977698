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

PRECISIONS: tuple[str, ...] = get_args(Precision)
ATTENTION_KINDS: tuple[str, ...] = get_args(Attention)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
DEVICES: tuple[str, ...] = get_args(Device)
MODEL_IMPLS: tuple[str, ...] = get_args(ModelImpl)

__all__ = [
    "ATTENTION_KINDS",
    "DEVICES",
    "MODEL_IMPLS",
    "OPTIMIZERS",
    "PRECISIONS",
    "Attention",
    "Device",
    "ModelImpl",
    "Optimizer",
    "Precision",
]
