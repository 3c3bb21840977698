"""Concurrent CUDA trials on one node get disjoint GPUs and a share of the node's CPUs: under the local launcher each
run's ranks see their own ``CUDA_VISIBLE_DEVICES``; under Ray each run's bundle reserves its GPUs' share of the CPUs,
so two 4-GPU trials are placed side by side on an 8-GPU node. Tested with logical GPUs: the ranks never touch CUDA."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from tuner.measure.driver import gpu_lease
from tuner.measure.driver.gpu_lease import DeviceLeases, TooFewDevices, node_devices
from tuner.measure.driver.launch_env import node_inherited, reserved_cpus
from tuner.measure.driver.local_launcher import launch_local
from tuner.measure.driver.ray_placement import assign_places, node_shape
from tuner.measure.measurement import Measurement
from tuner.measure.run_protocol import RunSpec
from tuner.workload import ClusterSpec, LaunchEnv, TrainSpec, Workload, load_builtin_model, workload_to_dict

ENV_RANK = Path(__file__).with_name("env_rank.py")


def cuda_spec(gpus: int) -> RunSpec:
    workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=gpus, device="cuda"), TrainSpec(64))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}}
    return RunSpec(workload_to_dict(workload), config, device="cuda", warmup=1, steps=1)


def run_together(launch, runs: int, tmp_path: Path) -> list[tuple[Measurement, list[dict]]]:
    """``runs`` launches at once, each rank waiting for every rank of all (the runs overlap for sure)."""
    outs = [tmp_path / f"run{index}" for index in range(runs)]
    results: list[Measurement | None] = [None] * runs

    def one(index: int) -> None:
        outs[index].mkdir()
        results[index] = launch([sys.executable, str(ENV_RANK), str(outs[index])])

    threads = [threading.Thread(target=one, args=(index,)) for index in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen = [[json.loads(path.read_text()) for path in sorted(out.glob("env-*.json"))] for out in outs]
    return [(result, envs) for result, envs in zip(results, seen, strict=True) if result is not None]


def test_concurrent_local_cuda_runs_see_disjoint_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 2-GPU runs on a 4-GPU node: GPUs 0,1 and 2,3 (before, both ranks' sets were the node's 0-3)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("ENV_RANK_TOGETHER", "4")
    monkeypatch.setattr(gpu_lease, "_leases", None)
    done = run_together(lambda entry: launch_local(cuda_spec(2), timeout=180, entry=entry), 2, tmp_path)
    assert [result.status for result, _ in done] == ["ok", "ok"], [result.error for result, _ in done]
    sets = [{env["CUDA_VISIBLE_DEVICES"] for env in envs} for _, envs in done]
    assert all(len(one) == 1 for one in sets), sets  # a run's ranks share their set and pick by LOCAL_RANK
    first, second = (set(next(iter(one)).split(",")) for one in sets)
    assert len(first) == len(second) == 2 and not first & second, sets


def test_a_run_larger_than_the_node_is_refused_and_leases_wait_for_each_other() -> None:
    leases = DeviceLeases(["GPU-5e0d", "MIG-1c2f", "2"])
    with pytest.raises(TooFewDevices), leases.lease(4):
        pass
    taken = threading.Event()
    with leases.lease(2) as held:
        assert held == ("GPU-5e0d", "MIG-1c2f")  # UUIDs and MIG instances pass as written
        waiter = threading.Thread(target=lambda: leases.lease(2).__enter__() and taken.set())
        waiter.start()
        assert not taken.wait(0.3)  # only one device is free while the first run holds two
    waiter.join(timeout=30)
    assert taken.is_set()
    assert node_devices({"CUDA_VISIBLE_DEVICES": "GPU-5e0d, GPU-77aa"}) == ["GPU-5e0d", "GPU-77aa"]


def test_a_ray_rank_reserves_its_gpus_share_of_the_node() -> None:
    """On an 8-GPU, 64-CPU node a 4-GPU trial's rank reserves 8 CPUs (half the node for the trial), not 16 (all)."""
    assert reserved_cpus(LaunchEnv(), 4, 64, {}, node_gpus=8) == 8
    assert reserved_cpus(LaunchEnv(), 4, 64, {}) == 16  # CPU ranks: the node's cores over the trial's ranks
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0}}, {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    assert node_shape(nodes, cuda=True) == (64, 8)


def test_gpu_ids_given_as_uuids_are_placed() -> None:
    """Ray reports a node's GPUs as its CUDA_VISIBLE_DEVICES names them: MIG instances and UUIDs crashed ``int()``."""
    actors = [
        {"node_id": "n", "hostname": "h", "gpu_ids": ["MIG-b2"]},
        {"node_id": "n", "hostname": "h", "gpu_ids": ["MIG-a1"]},
    ]
    places = assign_places([actors], cuda=True)[0]
    assert [place.local_rank for place in places] == [1, 0]
    assert {place.visible_devices for place in places} == {"MIG-a1,MIG-b2"}


def test_a_nodes_own_nccl_settings_win_over_the_drivers() -> None:
    driver = {"NCCL_SOCKET_IFNAME": "lo", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "OMP_NUM_THREADS": "4"}
    node = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "OMP_NUM_THREADS": "1"}
    assert node_inherited(driver, node) == {
        "NCCL_SOCKET_IFNAME": "ib0",
        "NCCL_IB_HCA": "mlx5_0",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "OMP_NUM_THREADS": "4",  # a Ray worker's own is Ray's
    }


@pytest.mark.slow
def test_two_2_gpu_trials_are_placed_side_by_side_on_a_4_gpu_ray_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local Ray node with 4 logical GPUs and 4 CPUs: both trials placed at once, on disjoint GPUs (before, the
    first trial's bundle took every CPU and the second waited out its placement)."""
    ray = pytest.importorskip("ray")
    from tuner.measure.driver.ray_launcher import ensure_ray, launch_ray

    if ray.is_initialized():
        ray.shutdown()
    ensure_ray(num_cpus=4, num_gpus=4)
    try:
        monkeypatch.setenv("ENV_RANK_TOGETHER", "4")
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # DeepSpeed's rule then wants every core per rank
        done = run_together(
            lambda entry: launch_ray(cuda_spec(2), timeout=240, entry=entry, placement_timeout=120), 2, tmp_path
        )
    finally:
        ray.shutdown()
    assert [result.status for result, _ in done] == ["ok", "ok"], [result.error for result, _ in done]
    first, second = ({env["CUDA_VISIBLE_DEVICES"] for env in envs} for _, envs in done)
    assert len(first) == len(second) == 1
    assert not set(next(iter(first)).split(",")) & set(next(iter(second)).split(","))
