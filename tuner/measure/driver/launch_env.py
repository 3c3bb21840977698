"""The launcher's side of the launch environment: what each rank of a run gets under the workload's
:class:`tuner.workload.LaunchEnv` on the node it runs on (:func:`plan_rank`), the variables passed to the rank's
process (:func:`rank_variables`), the CPUs Ray reserves for it (:func:`reserved_cpus`), and what the run's ranks
reported, summed up for the measurement (:func:`measured_launch`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.measure.driver.places import RankPlace
from tuner.measure.measurement import RankResult
from tuner.measure.run_protocol import CORES_VARIABLE, THREADS_VARIABLE
from tuner.workload import LaunchEnv, RankEnv, rank_env
from tuner.workload.launch_env import speed_variable


def physical_cores() -> int:
    """This node's physical cores, as DeepSpeed's core binding and torch's default thread count see them."""
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def plan_rank(
    launch: LaunchEnv,
    place: RankPlace,
    nodes: int,
    inherited: Mapping[str, str],
    cores: int | None = None,
    threads: int | None = None,
) -> RankEnv:
    """The environment the rank at ``place`` gets on this node (``cores``: its physical cores, default this node's;
    ``threads``: the trial's own threads per rank, over the launch environment's rule). ``launch`` is checked again
    first (:meth:`tuner.workload.LaunchEnv.check`): a variable outside the allow-list never reaches a rank or a fork
    server, however the launch environment got here."""
    launch.check()
    return rank_env(
        launch,
        physical_cores=cores or physical_cores(),
        local_world_size=place.local_world_size,
        local_rank=place.local_rank,
        inherited=inherited,
        nodes=nodes,
        trial_threads=threads,
    )


def node_inherited(driver: Mapping[str, str], node: Mapping[str, str]) -> dict[str, str]:
    """The user's environment for a rank on a Ray node: the driver's, with the node's own ``NCCL_*``,
    ``PYTORCH_CUDA_ALLOC_CONF``, ``CUDA_DEVICE_MAX_CONNECTIONS`` and ``MKL_NUM_THREADS`` over it (a node's network
    interface, its NCCL plugin or allocator settings are the node's; the driver, maybe a laptop or a CPU pod, must not
    override every node's). ``OMP_NUM_THREADS`` stays the driver's: a Ray worker's own is Ray's (its CPUs), not the
    node's. A workload's ``--launch-var`` still wins over both (:func:`tuner.workload.rank_env`).

    >>> node_inherited({"NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "4"}, {"NCCL_SOCKET_IFNAME": "ib0",
    ...     "OMP_NUM_THREADS": "1", "HOME": "/root"})
    {'NCCL_SOCKET_IFNAME': 'ib0', 'OMP_NUM_THREADS': '4'}
    """
    own = {name: value for name, value in node.items() if speed_variable(name) and name != "OMP_NUM_THREADS"}
    return {**driver, **own}


def rank_variables(planned: RankEnv) -> dict[str, str]:
    """The variables the rank's process starts with: the planned ones, and the launcher-to-rank protocol's."""
    variables = {**planned.variables, THREADS_VARIABLE: str(planned.threads)}
    if planned.cores:
        variables[CORES_VARIABLE] = ",".join(str(core) for core in planned.cores)
    return variables


def reserved_cpus(
    launch: LaunchEnv,
    ranks_per_node: int,
    node_cpus: int,
    inherited: Mapping[str, str],
    threads: int | None = None,
    node_gpus: int = 0,
) -> int:
    """CPUs Ray reserves for each rank: the threads it will run (an offload trial's CPU Adam steps on them), at most
    its share of a node (a launcher whose rule oversubscribes the cores, as DeepSpeed's default does, cannot be
    reserved beyond the node). On a node with ``node_gpus`` GPUs a rank's share is the node's CPUs over its GPUs,
    not over the trial's ranks: a trial of 4 of 8 GPUs reserves half the node and leaves the rest to another.

    >>> reserved_cpus(LaunchEnv(), 4, 64, {}, node_gpus=8), reserved_cpus(LaunchEnv(), 4, 64, {})
    (8, 16)
    """
    place = RankPlace(0, ranks_per_node, 0, ranks_per_node)
    wanted = plan_rank(launch, place, 1, inherited, cores=node_cpus, threads=threads).threads
    return max(1, min(wanted, node_cpus // max(1, ranks_per_node, node_gpus)))


def with_plan(result: RankResult, planned: RankEnv) -> RankResult:
    """``result`` with the launcher's plan beside what the rank reported (the rule and the threads it asked for)."""
    result.launch = {**result.launch, "rule": planned.rule, "planned_threads": planned.threads}
    return result


def measured_launch(launch: LaunchEnv, results: Sequence[RankResult]) -> dict[str, Any]:
    """The launch a run was measured in: the workload's launcher and overrides, the rule that gave the threads, and
    what each rank reported (threads, affinity) with rank 0's variables."""
    reports = [result.launch for result in sorted(results, key=lambda r: r.rank)]
    first = reports[0] if reports else {}
    return {
        **launch.to_dict(),
        "rule": first.get("rule"),
        "planned_threads": first.get("planned_threads"),
        "threads_per_rank": [report.get("threads") for report in reports],
        "affinity_per_rank": [report.get("affinity") for report in reports],
        "reported_variables": first.get("variables", {}),
    }
