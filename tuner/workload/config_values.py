"""Reading typed values out of a ds_config's sections the way DeepSpeed's pydantic models accept them.

The only readers of raw ds_config values: :class:`tuner.workload.TrialConfig` and its section views
(:mod:`tuner.workload.zero`, :mod:`tuner.workload.layout`) use them, and a bad value is a :class:`ConfigError` that
names its dotted key. Pure Python and fast: the tuner resolves tens of thousands of configs.

Example:
    >>> read_int({"reduce_bucket_size": 5e8}, "reduce_bucket_size", 1, "zero_optimization.")
    500000000
    >>> read_bool({"overlap_comm": "yes"}, "overlap_comm", False, "zero_optimization.")
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: zero_optimization.overlap_comm: must be true or false, got 'yes'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.errors import InputError


class ConfigError(InputError):
    """A ds_config value dstune (and DeepSpeed) cannot accept; ``field`` is its dotted key."""


def section(config: Mapping[str, Any], key: str, prefix: str = "") -> dict[str, Any]:
    """The object at ``key`` (``{}`` when absent or null); anything but an object is refused."""
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{prefix}{key}", f"must be an object, got {type(value).__name__}")
    return value


SCALARS = (str, int, float, bool, type(None))


def content_key(value: Any, skip: frozenset[str] = frozenset()) -> tuple[Any, ...] | None:
    """A hashable key of a JSON value that equals another's only when both read the same: each scalar with its exact
    type (``1``, ``1.0`` and ``true`` are equal in Python, not to DeepSpeed), objects key by key in order; None for
    anything else (not worth keying). An object's top-level keys in ``skip`` are left out of its key.

    >>> content_key({"stage": 1}) == content_key({"stage": True}), content_key({"a": [1]})
    (False, None)
    >>> content_key({"stage": 1, "micro": 2}, skip=frozenset({"micro"})) == content_key({"stage": 1})
    True
    """
    if type(value) is not dict:
        return (type(value), value) if type(value) in SCALARS else None
    items = []
    for key, item in value.items():
        if key in skip:
            continue
        inner = (type(item), item) if type(item) in SCALARS else content_key(item)
        if inner is None or type(key) is not str:
            return None
        items.append((key, inner))
    return tuple(items)


def read_int(values: Mapping[str, Any], key: str, default: int, prefix: str, minimum: int = 0) -> int:
    """An integer at ``key`` (a float with an integer value counts, as DeepSpeed's ``int`` fields take ``5e8``)."""
    value = values.get(key, default)
    if type(value) is int and value >= minimum:  # the common case, checked first
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{prefix}{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{prefix}{key}", f"must be >= {minimum}, got {value}")
    return value


def read_bool(values: Mapping[str, Any], key: str, default: bool, prefix: str) -> bool:
    """``true`` or ``false`` at ``key``; nothing else is taken for one."""
    value = values.get(key, default)
    if value is not True and value is not False:
        raise ConfigError(f"{prefix}{key}", f"must be true or false, got {value!r}")
    return value


def enabled(config: Mapping[str, Any], key: str) -> bool:
    """A section's ``enabled`` flag (``bf16``, ``fp16``...): false when the section is absent."""
    values = section(config, key)
    return read_bool(values, "enabled", False, f"{key}.") if values else False


__all__ = ["ConfigError", "enabled", "read_bool", "read_int", "section"]
