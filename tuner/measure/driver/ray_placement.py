"""Where a Ray run's ranks go: the placement bundle one node gives a run, a rank's share of a node, why a layout
cannot be placed, and the rank each placed actor runs (:func:`assign_places`). Read by
:mod:`tuner.measure.driver.ray_launcher`.

A rank reserves the threads its launch environment gives it, at most its share of a node
(:func:`tuner.measure.driver.launch_env.reserved_cpus`): on CUDA the node's CPUs over its GPUs, so a trial of G of a
node's N GPUs holds G/N of its CPUs and N/G trials run side by side (before, each rank took the node's CPUs over the
trial's ranks, every CPU of the node, and a second trial waited out its placement timeout).

Example:
    >>> node_shape([{"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}}], cuda=True)
    (64, 8)
    >>> sorted(["GPU-9f2c", "10", "2"], key=device_key)
    ['2', '10', 'GPU-9f2c']
"""

from __future__ import annotations

import os
from typing import Any

import ray

from tuner.measure.driver.places import RankPlace


def device_key(device: object) -> tuple[int, int, str]:
    """Sort key of a GPU id: indices in number order, then UUIDs (``GPU-…``, ``MIG-…``) as text; never ``int()`` of
    a UUID."""
    text = str(device)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def node_bundle(gpus_per_node: int, cuda: bool, cpus_per_rank: int = 1) -> dict[str, float]:
    """The resources one node gives the job: ``cpus_per_rank`` CPUs per rank, and a GPU per rank on CUDA."""
    cpus = float(gpus_per_node * cpus_per_rank)
    return {"CPU": cpus, "GPU": float(gpus_per_node)} if cuda else {"CPU": cpus}


def node_shape(cluster: list[dict[str, Any]], cuda: bool) -> tuple[int, int]:
    """(CPUs, GPUs) of the smallest alive node of ``cluster`` (``ray.nodes()``) that has GPUs on CUDA (any on CPU),
    which every rank's reservation must fit: a rank's share of a node is its CPUs over its GPUs on CUDA."""
    alive = [node.get("Resources", {}) for node in cluster if node.get("Alive")]
    if cuda:
        alive = [resources for resources in alive if resources.get("GPU", 0) > 0] or alive
    shapes = [(int(res.get("CPU", 0)), int(res.get("GPU", 0))) for res in alive if res.get("CPU", 0) > 0]
    return min(shapes, default=(os.cpu_count() or 1, 0))


def missing_resources(bundle: dict[str, float], nodes: int, cluster: list[dict[str, Any]]) -> str | None:
    """Why no ``nodes`` distinct alive nodes of ``cluster`` (``ray.nodes()``) can each hold ``bundle``, or None."""
    alive = [node for node in cluster if node.get("Alive")]
    short: dict[str, dict[str, float]] = {}
    for node in alive:
        total = node.get("Resources", {})
        lacking = {key: need - total.get(key, 0.0) for key, need in bundle.items() if total.get(key, 0.0) < need}
        if lacking:
            short[node["NodeID"]] = lacking
    able = len(alive) - len(short)
    if able >= nodes:
        return None
    shortfalls = "; ".join(
        f"node {node_id[:12]} lacks " + ", ".join(f"{key} {amount:g}" for key, amount in lacking.items())
        for node_id, lacking in short.items()
    )
    return (
        f"the layout needs {nodes} node(s) with {_resources(bundle)} each; the cluster has {able} such node(s) of "
        f"{len(alive)} alive, missing {nodes - able} node(s) with {_resources(bundle)}"
        + (f" ({shortfalls})" if short else "")
    )


def why_unplaced(bundle: dict[str, float], nodes: int, waited: float) -> str:
    """The error of a layout Ray did not place in time: what the cluster lacks, or what other jobs hold."""
    prefix = f"Ray could not place {nodes} node(s) with {_resources(bundle)} each within {waited:.0f} s: "
    missing = missing_resources(bundle, nodes, ray.nodes())
    if missing:
        return prefix + missing
    available = ray.available_resources()
    free = _resources({key: available.get(key, 0.0) for key in bundle})
    return prefix + f"free in the cluster now {free}; other jobs hold the rest"


def _resources(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{key}: {amount:g}" for key, amount in bundle.items()) + "}"


def assign_places(nodes: list[list[dict[str, Any]]], cuda: bool) -> list[list[RankPlace]]:
    """Ranks for the actors of each node (``nodes[node_rank]`` = the ``describe()`` of its actors, in start order).

    Within a node, actors are ordered by their first GPU id (start order on CPU): that order is the local rank. Ids
    are Ray's strings, indices or UUIDs (``GPU-…``, MIG's ``MIG-…``) as the node's ``CUDA_VISIBLE_DEVICES`` names
    them, passed on as they are.
    Returns the places in the same shape as ``nodes``.
    """
    per_node = len(nodes[0])
    world = per_node * len(nodes)
    places: list[list[RankPlace]] = []
    for node_rank, actors in enumerate(nodes):
        order = sorted(range(len(actors)), key=lambda i: ([device_key(g) for g in actors[i]["gpu_ids"]], i))
        visible = None
        if cuda:
            visible = ",".join(sorted({str(g) for actor in actors for g in actor["gpu_ids"]}, key=device_key))
        local_ranks = {index: local_rank for local_rank, index in enumerate(order)}
        places.append(
            [
                RankPlace(
                    rank=node_rank * per_node + local_ranks[index],
                    world_size=world,
                    local_rank=local_ranks[index],
                    local_world_size=per_node,
                    node_rank=node_rank,
                    node_id=actor["node_id"],
                    hostname=actor["hostname"],
                    visible_devices=visible,
                )
                for index, actor in enumerate(actors)
            ]
        )
    return places
