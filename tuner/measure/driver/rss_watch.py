"""A hard cap on the host memory each rank holds, whatever its estimate said: an estimate that is wrong still cannot
take the host (and other users' processes with it, through the kernel's or Ray's OOM killer).

The launcher reads each live rank's resident memory (RSS) at each poll (:func:`over_cap`); a rank past its cap is
SIGKILLed at once with its process group, its peers stopped as after any failed rank (:func:`stop_over`), and the rank
ends ``oom`` / ``HostMemory`` with the figure it reached (:mod:`tuner.measure.driver.outcomes`): the config does not
fit here, as a measured overflow says. The cap is the rank's share of the memory available on its host when it
started (:func:`~.host_memory.rank_share`). What a rank holds is its resident memory, and past the cap its
proportional share (PSS), so the pages a forked rank shares with its fork server do not count whole in every rank.
The rank's own process only: the compilers a first run's op build starts (about 1 GB each) are the build's, not the
config's, and end with it. Between two polls (0.2 s) a rank can grow past its cap by what it writes meanwhile: the
fifth of available memory a run never takes covers that.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tuner.measure.driver.processes import RankProcess, stop_ranks

OVER_MEMORY = "host_memory"  # RankProcess.killed_for of a rank stopped at its cap


def resident(pid: int) -> int:
    """Resident bytes of process ``pid`` (0 when it is gone)."""
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def proportional(pid: int) -> int:
    """Process ``pid``'s proportional share of the memory it maps (PSS: a page shared by n processes counts 1/n;
    about 17 ms for a rank, so read only past the cap), its resident bytes where the kernel does not say."""
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except (psutil.Error, AttributeError):  # no smaps (another OS): RSS
        return resident(pid)


def over_cap(ranks: Sequence[RankProcess], cap: int) -> tuple[RankProcess, int] | None:
    """The first live rank holding more than ``cap`` bytes, with what it holds; None when none does. Resident memory
    is read at each poll; past the cap, the rank's proportional share decides (:func:`proportional`): the pages a
    forked rank shares with its fork server and its peers count once over them, not once in each."""
    for rank in ranks:
        if rank.process.poll() is None and resident(rank.process.pid) > cap:
            held = proportional(rank.process.pid)
            if held > cap:
                return rank, held
    return None


def stop_over(ranks: Sequence[RankProcess], rank: RankProcess, held: int, cap: int) -> None:
    """SIGKILL ``rank`` (past its cap: no grace to grow further in), noting what it held against ``cap``, then stop
    its peers as after a failed rank (their collectives would wait on it)."""
    rank.over_memory = (held, cap)
    rank.signalled_at = time.time()
    rank.kill(OVER_MEMORY)
    stop_ranks([other for other in ranks if other is not rank], "peer")


__all__ = ["OVER_MEMORY", "over_cap", "proportional", "resident", "stop_over"]
