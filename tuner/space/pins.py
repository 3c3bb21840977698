"""What pins imply: a parameter pinned off its default that applies only where another parameter equals a value
(hpZ only at ``stage == 3``, checkpoint offload only with ``activation_checkpointing == true``) pins that one to it,
so that a study searches where the pin applies instead of pruning every trial that lands elsewhere.

Example:
    >>> from tuner.space import default_space_path, load_space
    >>> load_space(default_space_path(), pins={"hpz_partition_size": 2}).pins
    {'hpz_partition_size': 2, 'stage': 3}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.space.conditions import Condition, same
from tuner.space.errors import SpaceError
from tuner.space.parameters import Parameter


def implied_pins(parameters: Mapping[str, Parameter], pins: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``pins`` (checked values, by parameter name) with the ``==`` conditions of every pin off its default added,
    transitively.

    Raises:
        SpaceError: a condition's parameter is pinned to another value, naming the pin that needs it.
    """
    implied = dict(pins)
    queue = list(pins)
    while queue:
        name = queue.pop()
        parameter = parameters[name]
        if same(implied[name], parameter.default):
            continue
        for condition in parameter.when:
            if not isinstance(condition, Condition) or condition.op != "==" or condition.name not in parameters:
                continue
            if condition.name not in implied:
                implied[condition.name] = condition.value
                queue.append(condition.name)
            elif not same(implied[condition.name], condition.value):
                raise SpaceError(
                    source,
                    f"pins.{name}",
                    f"{implied[name]!r} applies only when {condition}, but {condition.name} is pinned to "
                    f"{implied[condition.name]!r}",
                )
    return implied


__all__ = ["implied_pins"]
