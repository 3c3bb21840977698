"""Measured ranks run in the workload's launch environment and report what they actually ran with: torch's threads,
the cores the OS lets them run on, and the variables in their environment (read back inside each rank, the truth
being torch and the OS, not the launcher's plan)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("deepspeed")

from tuner.measure.driver.launch_env import physical_cores
from tuner.measure.driver.local_launcher import launch_local
from tuner.measure.run_protocol import RunSpec
from tuner.workload import (
    ClusterSpec,
    LaunchEnv,
    TrainSpec,
    Workload,
    load_builtin_model,
    workload_to_dict,
)

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
BOUND = LaunchEnv.of(bind_cores=True, variables={"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_ALGO": "Ring"})
THREE = LaunchEnv.of("torchrun", variables={"OMP_NUM_THREADS": "3"})


def spec(launch: LaunchEnv, threads: int | None = None) -> RunSpec:
    workload = Workload(
        load_builtin_model("tiny-gpt2"),
        ClusterSpec(gpus_per_node=2, device="cpu"),
        TrainSpec(seq_len=32, precision="fp32"),
        launch=launch,
    )
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    if threads is not None:  # the trial's own threads per rank, as tune --search-threads proposes them
        config["dstune"] = {"threads_per_rank": threads}
    return RunSpec(workload_to_dict(workload), config, device="cpu", warmup=1, steps=1, true_peak=False)


@pytest.fixture(scope="module")
def runs() -> Callable[[str], Any]:
    """Three 2-rank runs, each made once for the module when a test first asks for it: bound to cores with two
    NCCL/CUDA variables, torchrun's rules with 3 threads forced, and a trial of its own 2 threads per rank under
    that same 3-thread launch."""
    specs = {"bound": lambda: spec(BOUND), "three": lambda: spec(THREE), "trial": lambda: spec(THREE, threads=2)}
    made: dict[str, Any] = {}

    def run(name: str) -> Any:
        if name not in made:
            made[name] = launch_local(specs[name](), timeout=600)
        return made[name]

    return run


def test_bound_ranks_run_on_their_own_cores_with_deepspeeds_thread_count(runs) -> None:
    run = runs("bound")
    assert run.status == "ok", run.error
    per_rank = max(1, physical_cores() // 2)
    for rank in run.ranks:
        assert rank.launch["threads"] == per_rank == rank.launch["planned_threads"]
        first = (per_rank * rank.rank) % physical_cores()
        assert rank.launch["affinity"] == list(range(first, first + per_rank))
        assert rank.launch["variables"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert rank.launch["variables"]["NCCL_ALGO"] == "Ring"
        assert rank.launch["variables"]["OMP_NUM_THREADS"] == str(per_rank)
    assert run.launch["launcher"] == "deepspeed" and run.launch["bind_cores"]
    assert run.launch["threads_per_rank"] == [per_rank, per_rank]
    assert "numa.py" in run.launch["rule"]


def test_an_override_sets_the_threads_and_unbound_ranks_keep_every_core(runs) -> None:
    run = runs("three")
    assert run.status == "ok", run.error
    assert run.launch["threads_per_rank"] == [3, 3]  # torch.get_num_threads() inside each rank
    assert run.launch["rule"] == "--launch-var OMP_NUM_THREADS"
    for rank in run.ranks:
        assert len(rank.launch["affinity"]) >= physical_cores()  # not bound: the whole machine
        assert rank.launch["variables"]["OMP_NUM_THREADS"] == "3"
    assert run.to_dict()["launch"]["reported_variables"]["OMP_NUM_THREADS"] == "3"  # what storage keeps


def test_a_trials_own_threads_win_over_the_launch_environments(runs) -> None:
    """``dstune.threads_per_rank`` (searched with ``tune --search-threads``): each rank runs with that many threads,
    read back from torch inside the rank; DeepSpeed never sees the ``dstune`` section."""
    run = runs("trial")
    assert run.status == "ok", run.error
    assert run.launch["threads_per_rank"] == [2, 2]  # torch.get_num_threads() inside each rank
    assert "dstune.threads_per_rank" in run.launch["rule"]
    for rank in run.ranks:
        assert rank.launch["variables"]["OMP_NUM_THREADS"] == "2"
