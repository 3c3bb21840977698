"""The memory limit of this process's control group, where one is set: what a container or a systemd slice allows
whatever the host's own figures say (pure file reads, no psutil).

cgroup v2: ``memory.max`` and ``memory.current`` of this process's group and each group above it (a limit holds for
everything below it); cgroup v1: ``memory.limit_in_bytes`` and ``memory.usage_in_bytes`` of the ``memory``
hierarchy's group, else of the hierarchy's mount (a container sees its own group as the root). The tightest limit
wins: :func:`cgroup_limit` gives it with what the group uses now.

Example:
    >>> cgroup_limit(Path("/nonexistent"), Path("/nonexistent/cgroup")) is None
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

NO_LIMIT = 2**60  # v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large is none


class CgroupLimit(NamedTuple):
    """A group's memory limit and what its processes use now (bytes)."""

    limit: int
    usage: int

    @property
    def headroom(self) -> int:
        """What the group may still take."""
        return max(0, self.limit - self.usage)


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2's no limit) and unreadable files are none


def _limited(folder: Path, limit_file: str, usage_file: str) -> CgroupLimit | None:
    limit, usage = _number(folder / limit_file), _number(folder / usage_file)
    if limit is None or limit >= NO_LIMIT or usage is None:
        return None
    return CgroupLimit(limit, usage)


def _groups(proc: Path) -> tuple[str | None, str | None]:
    """This process's v2 group path and v1 ``memory`` group path, from ``/proc/self/cgroup``."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None, None
    unified = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    memory = next((line.split(":", 2)[2] for line in lines if line.split(":", 2)[1:2] == ["memory"]), None)
    return unified, memory


def cgroup_limit(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> CgroupLimit | None:
    """The tightest memory limit over this process's control groups (v2 up to the root, v1's ``memory`` group), or
    None where no limit is set or none can be read."""
    unified, memory = _groups(proc)
    found: list[CgroupLimit] = []
    if unified is not None:
        folder = root / unified.strip("/")
        for group in (folder, *folder.parents):
            if group == root.parent:
                break
            hit = _limited(group, "memory.max", "memory.current")
            if hit is not None:
                found.append(hit)
    if memory is not None:
        for folder in (root / "memory" / memory.strip("/"), root / "memory"):
            hit = _limited(folder, "memory.limit_in_bytes", "memory.usage_in_bytes")
            if hit is not None:
                found.append(hit)
                break
    return min(found, key=lambda hit: hit.headroom, default=None)


__all__ = ["CgroupLimit", "cgroup_limit"]
