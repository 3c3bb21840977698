"""On CPU ranks a rank's measured peak counts the states it offloads to the CPU as well as its device part (one
memory holds both): the study compares it with the device estimate plus the rank's share of the offloaded states,
and judges the GPU budget on the device part only. Found with a 2-node hpZ study of ZeRO-3 with both offloads on 4
CPU ranks: measured 17,064,929 B against an estimated 11,132,164 B on the device and 5,928,576 B offloaded per rank,
so the study learned a 50 % margin and pruned the rest."""

from __future__ import annotations

from tuner.estimator import estimate
from tuner.study.outcome import measured_over
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

WORK = Workload(
    load_builtin_model("tiny-llama"),
    ClusterSpec(gpus_per_node=2, nodes=2, gpu_memory=64 * 2**20, device="cpu"),
    TrainSpec(128),
)


def zero3(offload: str) -> TrialConfig:
    zero = {"stage": 3, "offload_optimizer": {"device": offload}, "offload_param": {"device": offload}}
    return TrialConfig(
        {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2,
            "zero_optimization": zero,
            "bf16": {"enabled": True},
        }
    )


def test_a_rank_holds_its_share_of_what_its_node_offloads() -> None:
    offloaded = estimate(WORK, zero3("cpu"))
    states = sum(offloaded.cpu_per_node[name] for name in ("parameters", "gradients", "optimizer_states", "buffers"))
    assert states > 0 and offloaded.host_states_per_rank(2) == states // 2
    assert estimate(WORK, zero3("none")).host_states_per_rank(2) == 0


def test_the_gpu_budget_is_judged_without_what_a_gpu_would_not_hold() -> None:
    budget, host = 64 * 2**20, 6 * 2**20
    assert measured_over(budget + host, budget, host) is None
    reason = measured_over(budget + host + 1, budget, host)
    assert reason is not None and "offloads to the CPU" in reason and "by 1 B" in reason
    assert measured_over(budget + 1, budget) is not None
