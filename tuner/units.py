"""Byte sizes: parse "80GiB" / "512GB" / "1e9" and format bytes for people."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

MiB = 2**20
GiB = 2**30


def parse_bytes(text: str | int | float) -> int:
    """Parse a memory size with an optional unit into bytes.

    Args:
        text: ``"80GiB"``, ``"512GB"``, ``"1.5TiB"``, ``"1e9"`` or a number of bytes.

    Returns:
        The size in bytes, rounded down to an integer.

    Raises:
        ValueError: the text is not a size, names an unknown unit, or is not positive.

    Example:
        >>> parse_bytes("80GiB")
        85899345920
    """
    if isinstance(text, bool):
        raise ValueError(f"not a memory size: {text!r}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        match = _SIZE.match(text)
        if not match:
            raise ValueError(f"not a memory size: {text!r} (use e.g. 80GiB, 512GB or plain bytes)")
        value, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {match.group(2)!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return size


def format_bytes(size: int | None) -> str:
    """Format bytes in GiB (or MiB below 1 GiB) for tables; ``None`` prints as ``-``."""
    if size is None:
        return "-"
    if abs(size) >= GiB:
        return f"{size / GiB:.2f} GiB"
    return f"{size / 2**20:.1f} MiB"


def memory_unit(budget: int) -> tuple[str, int]:
    """The unit figures under a memory budget read in, and its bytes: MiB below 1 GiB, else GiB (the rule of
    :func:`format_bytes`), so a 64 MiB budget's free memory reads 24.0 MiB, not 0.02 GiB.

    >>> memory_unit(2**26), memory_unit(80 * GiB)
    (('MiB', 1048576), ('GiB', 1073741824))
    """
    return ("MiB", MiB) if 0 < budget < GiB else ("GiB", GiB)


def in_unit(size: int | None, unit: tuple[str, int]) -> str:
    """``size`` as a figure in ``unit`` (:func:`memory_unit`'s), to print beside the unit's name: two decimals in
    GiB, one in MiB; None prints as ``unknown``.

    >>> in_unit(40 * MiB, memory_unit(64 * MiB)), in_unit(40 * MiB, memory_unit(80 * GiB)), in_unit(None, ("GiB", GiB))
    ('40.0', '0.04', 'unknown')
    """
    if size is None:
        return "unknown"
    name, scale = unit
    return f"{size / scale:.{2 if name == 'GiB' else 1}f}"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str | float) -> float:
    """Parse ``"8h"``, ``"1h30m"``, ``"90s"``, ``"2d"`` or plain seconds into seconds.

    Example:
        >>> parse_duration("1h30m")
        5400.0
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        compact = str(text).strip().lower()
        try:
            seconds = float(compact)
        except ValueError:
            parts = _DURATION.findall(compact)
            if not parts or "".join(f"{n}{u}" for n, u in parts) != compact.replace(" ", ""):
                raise ValueError(f"not a duration: {text!r} (use e.g. 8h, 30m, 1h30m or seconds)") from None
            seconds = sum(float(number) * _SECONDS[unit] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


def parse_fraction(text: str | float) -> float:
    """A share as a fraction (``0.05``) or a percentage (``"5%"``), as a fraction; ``ValueError`` otherwise.

    Example:
        >>> parse_fraction("10%"), parse_fraction("0.05"), parse_fraction(0)
        (0.1, 0.05, 0.0)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    compact = str(text).strip()
    try:
        return float(compact[:-1]) / 100 if compact.endswith("%") else float(compact)
    except ValueError:
        raise ValueError(f"expected a fraction such as 0.05 or a percentage such as 5%, got {text!r}") from None


def format_duration(seconds: float) -> str:
    """Seconds for people: ``42 s``, ``6.5 min``, ``2.3 h``.

    Example:
        >>> format_duration(42.4), format_duration(388.3), format_duration(9000)
        ('42 s', '6.5 min', '2.5 h')
    """
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
