"""An adapter config's regular expressions resolved to explicit module names with RE2, before peft sees them.

peft matches a string ``target_modules`` or ``exclude_modules`` (``re.fullmatch``) and each ``rank_pattern`` /
``alpha_pattern`` key (``re.match(r"(.*\\.)?(key)$")``) with Python's backtracking ``re``: a hostile pattern would
take exponential time there. :func:`resolved_adapter` matches those patterns against the model's module names with
RE2 (:mod:`tuner.workload.patterns`, linear time) and hands peft what they matched as plain data: the module names as
a list, and each pattern key replaced by the escaped full names it picks (first key wins, as in peft). The model
that results is the same; the only patterns peft still runs are escaped literals.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tuner.errors import InputError
from tuner.workload import WorkloadError
from tuner.workload.patterns import compile_pattern, full_matches, suffix_matches

PLAIN_NAME = r"[A-Za-z0-9_]{1,128}"  # a layers_pattern entry: a module attribute name, never a regex


def _names_field(adapter: dict[str, Any], field: str, modules: Sequence[str]) -> None:
    """A string ``field`` (a regex) replaced by the names it matches whole."""
    pattern = adapter.get(field)
    if not isinstance(pattern, str) or pattern == "all-linear":  # peft's keyword, not a pattern
        return
    matched = full_matches(pattern, modules, f"peft.{field}")
    if not matched and field == "target_modules":
        raise InputError(f"peft.{field}", f"{pattern!r} not found in the model (it matches no module name whole)")
    adapter[field] = matched or None


def _pattern_field(adapter: dict[str, Any], field: str, modules: Sequence[str]) -> None:
    """Each key of a ``rank_pattern``/``alpha_pattern`` object replaced by the escaped names it picks first."""
    patterns = adapter.get(field)
    if not isinstance(patterns, dict) or not patterns:
        return
    explicit: dict[str, Any] = {}
    for key, value in patterns.items():
        for name in suffix_matches(key, modules, f"peft.{field}.{key}"):
            explicit.setdefault(re.escape(name), value)
    adapter[field] = explicit


def _check_layers_pattern(adapter: dict[str, Any]) -> None:
    value = adapter.get("layers_pattern")
    entries = [value] if isinstance(value, str) else value or []
    plain = compile_pattern(PLAIN_NAME, "layers_pattern")
    if not isinstance(entries, list) or not all(isinstance(e, str) and plain.fullmatch(e) for e in entries):
        raise InputError("peft.layers_pattern", "must be module attribute names (letters, digits, _), e.g. layers")


def resolved_adapter(adapter: dict[str, Any], modules: Sequence[str]) -> dict[str, Any]:
    """A copy of ``adapter`` whose regular expressions are resolved against ``modules`` (the model's module names);
    a pattern RE2 cannot run, or a ``target_modules`` pattern matching nothing, is a :class:`WorkloadError`."""
    resolved = dict(adapter)
    try:
        for field in ("target_modules", "exclude_modules"):
            _names_field(resolved, field, modules)
        for field in ("rank_pattern", "alpha_pattern"):
            _pattern_field(resolved, field, modules)
        _check_layers_pattern(resolved)
    except InputError as error:
        raise WorkloadError(error.field, error.message) from None
    return resolved


__all__ = ["resolved_adapter"]
