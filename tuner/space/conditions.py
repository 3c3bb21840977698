"""``when`` conditions: one clause ``NAME OP VALUE`` (:class:`Condition`), alternatives ``A or B`` (:class:`AnyOf`),
the workload facts a clause may name besides earlier parameters (:data:`WORKLOAD_FACTS`), and the patterns a clause is
read with (:func:`tuner.space.parameter_entry.parse_when` reads a parameter's ``when``).

Also the value comparisons every part of the space shares: booleans are kept apart from numbers (``True != 1``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COMPARE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|>=|<=|>|<)\s*(\S.*)")
MEMBER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s+(not\s+in|in)\s+(\S.*)")
# what a condition may test about the workload (numbers; ``*_bytes`` also read sizes like 64MiB); no parameter may
# take these names. The values come from :func:`tuner.space.facts.workload_facts`.
WORKLOAD_FACTS: dict[str, str] = {
    "trainable_params": "parameters that train (all of them without a peft adapter or a freeze pattern)",
    "frozen_params": "parameters that do not train (0 for full fine-tuning)",
    "optimizer_state_bytes": "fp32 master and Adam moments of the trainable parameters, 12 B each, before ZeRO "
    "shards them",
    "seq_len": "the workload's sequence length (tokens per sample)",
    "world_size": "the ranks (GPUs per node × nodes)",
    "attention_heads": "the model's attention heads (0 for a bare parameter count)",
    "transformers_model": "1 when measured runs train the transformers model (Ulysses and ALST's tiling need its "
    "attention and layers, AutoTP its tp_plan; the built-in models refuse them), else 0",
    "gpus_per_node": "the GPUs (ranks) of one node: AutoTP and hpZ groups stay within a node",
    "nodes": "the nodes",
    "moe_model": "1 when the model has routed experts (AutoTP leaves them whole on every rank: AutoEP shards them), "
    "else 0",
    "cpu_ranks": "1 when the ranks train on CPU (every step runs on the rank's threads), 0 on CUDA",
}


def same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans apart from numbers (``True != 1`` here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def member(value: Any, values: Iterable[Any]) -> bool:
    """Whether ``value`` is in ``values`` by :func:`same`."""
    return any(same(value, other) for other in values)


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value: Any) -> bool:
    """An int above zero, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Condition:
    """One ``when`` clause: ``name op value``.

    Example:
        >>> Condition("stage", ">=", 1).holds({"stage": 3}), Condition("overlap", "==", 1).holds({"overlap": True})
        (True, False)
    """

    name: str
    op: str
    value: Any

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether the clause holds for the active values (an inactive or unset ``name`` never satisfies it)."""
        current = values.get(self.name)
        if current is None:
            return False
        if self.op == "==":
            return same(current, self.value)
        if self.op == "!=":
            return not same(current, self.value)
        if self.op == "in":
            return member(current, self.value)
        if self.op == "not in":
            return not member(current, self.value)
        if not is_number(current):
            return False
        return {">=": current >= self.value, "<=": current <= self.value, ">": current > self.value}.get(
            self.op, current < self.value
        )

    @property
    def names(self) -> frozenset[str]:
        """The name the clause tests."""
        return frozenset((self.name,))

    def __str__(self) -> str:
        return f"{self.name} {self.op} {json.dumps(self.value)}"


@dataclass(frozen=True)
class AnyOf:
    """Alternatives, one ``when`` item ``A or B``: holds when any of its clauses holds.

    Example:
        >>> either = AnyOf((Condition("frozen_params", "==", 0), Condition("optimizer_state_bytes", ">=", 2**26)))
        >>> either.holds({"frozen_params": 10, "optimizer_state_bytes": 2**27}), str(either)
        (True, 'frozen_params == 0 or optimizer_state_bytes >= 67108864')
    """

    options: tuple[Condition, ...]

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether any alternative holds for ``values``."""
        return any(option.holds(values) for option in self.options)

    @property
    def names(self) -> frozenset[str]:
        """The names its alternatives test."""
        return frozenset(option.name for option in self.options)

    def __str__(self) -> str:
        return " or ".join(str(option) for option in self.options)
