"""``when`` conditions: one clause ``NAME OP VALUE`` (:class:`Condition`) and the parser for a parameter's ``when``.

Also the value comparisons every part of the space shares: booleans are kept apart from numbers (``True != 1``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from tuner.space.errors import SpaceError

if TYPE_CHECKING:
    from tuner.space.parameters import Parameter

_COMPARE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|>=|<=|>|<)\s*(\S.*)")
_MEMBER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s+(not\s+in|in)\s+(\S.*)")


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

    def __str__(self) -> str:
        return f"{self.name} {self.op} {json.dumps(self.value)}"


def parse_when(raw: Any, where: str, earlier: list[Parameter], source: str) -> tuple[Condition, ...]:
    """A parameter's ``when`` (a string or a list of them, clauses joined by ``and``) checked against ``earlier``.

    Raises:
        SpaceError: A clause that cannot be read, names no earlier parameter, or tests a value it cannot take.
    """
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise SpaceError(source, where, f"must be a condition string like 'stage == 3' or a list of them, got {raw!r}")
    known = {parameter.name: parameter for parameter in earlier}
    clauses = [clause for item in items for clause in re.split(r"\s+and\s+", item.strip())]
    conditions = []
    for clause in clauses:
        match = _COMPARE.fullmatch(clause) or _MEMBER.fullmatch(clause)
        if not match:
            raise SpaceError(
                source, where, f"cannot read {clause!r}: write NAME OP VALUE, OP one of == != >= <= > < in, not in"
            )
        name, op, text = match.group(1), " ".join(match.group(2).split()), match.group(3)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise SpaceError(source, where, f"cannot read the value {text!r} in {clause!r}") from None
        if name not in known:
            raise SpaceError(
                source, where, f"names unknown parameter {name!r}; a condition may only name parameters defined above"
            )
        target = known[name]
        if op in ("in", "not in"):
            if not isinstance(value, list):
                raise SpaceError(source, where, f"{op!r} needs a list like [1, 2], got {text!r}")
            tested = value
        elif op in ("==", "!="):
            tested = [value]
        else:
            numeric = target.kind != "categorical" or all(is_number(c) for c in target.all_choices())
            if not is_number(value) or not numeric:
                raise SpaceError(source, where, f"{op!r} compares numbers; {clause!r} does not")
            tested = []
        for item in tested:
            if not target.contains(item):
                raise SpaceError(source, where, f"{clause!r} tests {item!r}, which is not a value of {name}")
        conditions.append(Condition(name, op, value))
    return tuple(conditions)
