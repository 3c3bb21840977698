"""The collective timeout on every process group of a rank, not only the default one.

``init_process_group(timeout=...)`` sets the default group's timeout alone. Every group made later without a timeout
of its own (``new_group``, ``new_subgroups``, ``split_group``, a device mesh's groups) takes torch's default for its
backend instead: 10 minutes for NCCL, 30 for gloo (``distributed_c10d._get_default_timeout``). DeepSpeed makes all of
its groups so (``deepspeed/comm/torch.py`` ``new_group(ranks)``): ZeRO's clone of the world group without an mpu
(``utils/groups.py`` ``_clone_world_group``), the sequence-, tensor- and expert-parallel groups and hpZ's. A rank
hung in one of them would hold its GPUs for 10 minutes past the run's collective timeout. :func:`every_group_times_out`
makes the run's timeout torch's default for every backend before the first group exists."""

from __future__ import annotations

from datetime import timedelta


def every_group_times_out(timeout: timedelta) -> None:
    """Make ``timeout`` the default of every group created from now on in this process, whatever its backend (the
    module globals ``_get_default_timeout`` reads at each call; NCCL's only where torch was built with it)."""
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout
    if isinstance(distributed_c10d.default_pg_nccl_timeout, timedelta):
        distributed_c10d.default_pg_nccl_timeout = timeout
