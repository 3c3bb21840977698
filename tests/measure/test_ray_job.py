"""Ranks placed as a multi-node job on a real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``).

Each node offers 4 CPUs and 4 logical GPUs (Ray's GPU resource without CUDA: actors get GPU ids and
``CUDA_VISIBLE_DEVICES`` as on a GPU node). CPU ranks train with real DeepSpeed over gloo; the CUDA layout's
environment is checked with a rank program that writes what it was given.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("deepspeed")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402

from tuner.measure.driver.ray_launcher import UNAVAILABLE, launch_ray  # noqa: E402
from tuner.measure.run_protocol import RunSpec  # noqa: E402
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, workload_to_dict  # noqa: E402

pytestmark = pytest.mark.deepspeed
HERE = Path(__file__).parent
NODE = {"num_cpus": 4, "num_gpus": 4}


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def spec(gpus: int, nodes: int, device: str = "cpu") -> RunSpec:
    workload = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=gpus, nodes=nodes, device=device),
        TrainSpec(seq_len=32),
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 50_000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    return RunSpec(workload_to_dict(workload), config, device=device, warmup=2, steps=2)


def node_ids() -> list[str]:
    return sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])


def test_one_rank_on_each_node_trains(two_nodes) -> None:
    result = launch_ray(spec(1, 2), timeout=400)
    assert result.status == "ok", result.error
    assert result.tokens_per_s > 0
    ranks = result.ranks
    assert [r.rank for r in ranks] == [0, 1] and [r.local_rank for r in ranks] == [0, 0]
    assert [r.node_rank for r in ranks] == [0, 1]
    assert sorted(r.node_id for r in ranks) == node_ids()
    assert all(r.hostname and len(r.step_times) == 2 for r in ranks)
    report = result.to_dict()["ranks"]
    assert {"rank", "node_id", "hostname", "local_rank", "status", "peak_bytes", "peak_rss_bytes", "step_times"} <= set(
        report[0]
    )
    assert all(r["peak_bytes"] > 0 and r["peak_rss_bytes"] > 0 for r in report)


def test_two_ranks_on_each_node_get_local_ranks_0_and_1(two_nodes) -> None:
    result = launch_ray(spec(2, 2), timeout=500)
    assert result.status == "ok", result.error
    by_node: dict[str, list[tuple[int, int, int]]] = {}
    for r in result.ranks:
        by_node.setdefault(r.node_id, []).append((r.node_rank, r.local_rank, r.rank))
    assert sorted(by_node) == node_ids()
    assert sorted(sorted(v) for v in by_node.values()) == [[(0, 0, 0), (0, 1, 1)], [(1, 0, 2), (1, 1, 3)]]


def test_cuda_layout_environment(two_nodes, tmp_path) -> None:
    """2 nodes × 4 GPUs: each rank sees its node's 4 GPUs, picks one by LOCAL_RANK, and meets rank 0's node."""
    entry = [sys.executable, str(HERE / "env_rank.py"), str(tmp_path)]
    result = launch_ray(spec(4, 2, device="cuda"), timeout=300, entry=entry)
    assert result.status == "ok", result.error
    envs = [json.loads((tmp_path / f"env-{rank}.json").read_text()) for rank in range(8)]
    master = {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in envs}
    assert len(master) == 1
    assert master.pop()[0] == ray.util.get_node_ip_address()
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4"
        assert env["NODE_RANK"] == str(rank // 4) and env["LOCAL_RANK"] == str(rank % 4)
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        left = f"deepspeed_allreduce_buffer_{os.getuid()}_{env['MASTER_ADDR']}_{env['MASTER_PORT']}_{rank}"
        assert not (Path("/dev/shm") / left).exists()  # each rank host removed its rank's shm segment
    nodes = [result.ranks[rank].node_id for rank in range(8)]
    assert nodes[:4] == [nodes[0]] * 4 and nodes[4:] == [nodes[4]] * 4 and nodes[0] != nodes[4]


def test_a_layout_the_cluster_cannot_hold_is_an_error_naming_what_is_missing(two_nodes) -> None:
    started = time.monotonic()
    three = launch_ray(spec(1, 3), timeout=60, placement_timeout=3)
    assert three.status == "error" and three.exception_type == UNAVAILABLE
    assert "missing 1 node(s) with {CPU: 1}" in three.error, three.error
    wide = launch_ray(spec(8, 1, device="cuda"), timeout=60, placement_timeout=3)
    assert wide.status == "error" and "lacks CPU 4, GPU 4" in wide.error, wide.error
    assert time.monotonic() - started < 40  # at the placement timeout, not the run's


def test_a_busy_cluster_answers_at_the_placement_timeout(two_nodes) -> None:
    held = placement_group([{"CPU": 4}, {"CPU": 4}], strategy="STRICT_SPREAD")
    ray.get(held.ready(), timeout=60)
    try:
        started = time.monotonic()
        result = launch_ray(spec(1, 2), timeout=60, placement_timeout=5)
        assert time.monotonic() - started < 30
    finally:
        remove_placement_group(held)
    assert result.status == "error" and result.exception_type == UNAVAILABLE
    assert "within 5 s" in result.error and "free in the cluster now {CPU: 0}" in result.error, result.error


def test_a_dying_rank_takes_its_peer_on_the_other_node_down(two_nodes) -> None:
    entry = [sys.executable, str(HERE / "fault_rank.py"), "exit", "1", "unused"]
    started = time.monotonic()
    result = launch_ray(spec(1, 2), timeout=400, entry=entry)
    assert result.status == "error" and "exited with code 3" in result.error, result.error
    assert result.ranks[1].node_id != result.ranks[0].node_id
    assert time.monotonic() - started < 200
