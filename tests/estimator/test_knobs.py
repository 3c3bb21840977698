"""Pinned host memory, round_robin_gradients and ZeRO-3's save phase in the estimate (pure arithmetic)."""

from __future__ import annotations

import pytest

from tuner.estimator import PHASES, estimate
from tuner.estimator.states.partitions import flat_partition, round_robin_order
from tuner.estimator.states.pinned import power_of_two_ceil
from tuner.forecast import Calibration, memory_reason, reason_key
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model, model_from_param_count

BASE = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}


def work(model: str = "llama-2-7b", gpus: int = 8, device: str = "cuda", **cluster: int) -> Workload:
    return Workload(
        load_builtin_model(model), ClusterSpec(gpus_per_node=gpus, device=device, **cluster), TrainSpec(seq_len=1024)
    )


def zero(**settings: object) -> dict:
    return {**BASE, "zero_optimization": settings}


def offload(pin: bool | None = None, device: str = "cpu") -> dict:
    return {"device": device} if pin is None else {"device": device, "pin_memory": pin}


# --- pinned host memory -------------------------------------------------------------------------------------------


def test_stage2_offload_pins_master_gradients_and_staging_rounded_to_powers_of_two() -> None:
    w = work()
    pinned = estimate(w, zero(stage=2, offload_optimizer=offload()))  # DeepSpeed's default: pin_memory true
    pageable = estimate(w, zero(stage=2, offload_optimizer=offload(pin=False)))
    part, largest, ranks = pinned.details["partition_elements"], w.model.largest_param, 8
    expected = 2 * power_of_two_ceil(4 * part) + power_of_two_ceil(2 * part) + power_of_two_ceil(2 * largest)
    assert pinned.details["pinned_host"] == expected
    assert pinned.cpu_per_node["pinned"] == ranks * expected
    assert pinned.details["pinned_rounding"] == expected - (8 * part + 2 * part + 2 * largest)
    # Adam's moments stay pageable; the fp32 master is pinned.
    assert pinned.cpu_per_node["optimizer_states"] == ranks * (power_of_two_ceil(4 * part) + 8 * part)
    assert pageable.cpu_per_node["optimizer_states"] == ranks * 12 * part
    assert pageable.cpu_per_node["pinned"] == 0 and "pinned_host" not in pageable.details
    rounding = ranks * pinned.details["pinned_rounding"]
    assert pinned.cpu_per_node["total"] - pageable.cpu_per_node["total"] == rounding > 0
    assert pinned.per_gpu == pageable.per_gpu  # pinning changes nothing on the device


def test_pinned_bytes_count_against_the_node_and_are_not_named_as_a_category() -> None:
    pageable = estimate(work(), zero(stage=2, offload_optimizer=offload(pin=False)))
    capacity = pageable.cpu_per_node["total"]
    w = work(cpu_memory=capacity)
    assert estimate(w, zero(stage=2, offload_optimizer=offload(pin=False))).fits
    pinned = estimate(w, zero(stage=2, offload_optimizer=offload(pin=True)))
    assert not pinned.fits
    assert "pinned" not in (pinned.overflow_reason() or "")
    reason = memory_reason(pinned, Calibration(margin=0.0))
    assert reason is not None and reason.memory == "cpu" and reason.largest == "optimizer_states"


def test_pinning_is_a_no_op_on_cpu_ranks() -> None:
    w = work("tiny-llama", gpus=2, device="cpu")
    for config in (
        zero(stage=2, offload_optimizer=offload()),
        zero(stage=3, offload_optimizer=offload(), offload_param=offload()),
    ):
        default = estimate(w, config)
        assert default.cpu_per_node["pinned"] == 0
        section = config["zero_optimization"]
        unpinned = {
            name: {**value, "pin_memory": False} if isinstance(value, dict) else value
            for name, value in section.items()
        }
        assert estimate(w, {**BASE, "zero_optimization": unpinned}).to_dict() == default.to_dict()


def test_stage3_param_offload_is_pinned_whatever_its_pin_memory_says() -> None:
    w = work()
    pinned = estimate(w, zero(stage=3, offload_param=offload(pin=True)))
    unpinned = estimate(w, zero(stage=3, offload_param=offload(pin=False)))
    assert pinned.to_dict() == unpinned.to_dict()
    shard = pinned.details["partition_elements"]
    assert pinned.details["pinned_host"] == power_of_two_ceil(2 * shard)
    assert pinned.cpu_per_node["parameters"] == 8 * power_of_two_ceil(2 * shard)


def test_stage3_optimizer_offload_pins_the_gradient_partitions_per_sub_group() -> None:
    w = work()
    config = zero(stage=3, sub_group_size=100_000_000, offload_optimizer=offload())
    est = estimate(w, config)
    shard = est.details["partition_elements"]
    full, rest = divmod(shard, 100_000_000)
    fp32 = full * power_of_two_ceil(400_000_000) + power_of_two_ceil(4 * rest)
    assert est.details["pinned_host"] == power_of_two_ceil(2 * shard) + fp32
    assert est.cpu_per_node["gradients"] == 8 * est.details["pinned_host"]
    config["zero_optimization"]["offload_optimizer"]["pin_memory"] = False
    assert estimate(w, config).cpu_per_node["gradients"] == 8 * 6 * shard


def test_nvme_swap_buffers_are_locked_at_their_size() -> None:
    est = estimate(work(), zero(stage=3, offload_param={"device": "nvme", "nvme_path": "/nvme", "pin_memory": False}))
    assert est.details["pinned_host"] == 5 * 100_000_000 * 2  # buffer_count × buffer_size × e, no rounding


# --- round_robin_gradients ----------------------------------------------------------------------------------------


def test_round_robin_order_is_deepspeeds() -> None:
    pytest.importorskip("deepspeed")
    torch = pytest.importorskip("torch")
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    numels = tuple(range(1, 12))
    for world in (2, 3, 4):
        tensors = [torch.empty(n) for n in numels]
        reordered, _ = DeepSpeedZeroOptimizer._round_robin_reorder(None, tensors, world)
        assert tuple(t.numel() for t in reordered) == round_robin_order(numels, world)


def test_round_robin_moves_only_the_zero2_worst_rank_gradients() -> None:
    w = work("tiny-llama", gpus=2)
    plain = estimate(w, zero(stage=2))
    robin = estimate(w, zero(stage=2, round_robin_gradients=True))
    numels = w.model.param_numels
    worst = flat_partition(round_robin_order(numels, 2), 2).worst_rank_grads
    assert worst != flat_partition(numels, 2).worst_rank_grads
    assert robin.phases["backward"].gpu["gradients"] == 2 * worst
    for name in ("parameters", "optimizer_states"):
        assert robin.per_gpu[name] == plain.per_gpu[name]
    # one bucket: its flattened copy is made before the partition exists, so the worst moment does not move
    held = {
        name: est.phases["backward"].gpu["gradients"] + est.phases["backward"].gpu["buffers"]
        for name, est in (("plain", plain), ("robin", robin))
    }
    assert held["plain"] == held["robin"]


@pytest.mark.parametrize("stage", [1, 2])
def test_round_robin_leaves_the_offloaded_estimate_unchanged(stage: int) -> None:
    """With optimizer offload (what round_robin_gradients is for) it only changes which rank copies which gradient
    to the host: no estimated byte depends on the order."""
    w = work()
    plain = estimate(w, zero(stage=stage, offload_optimizer=offload()))
    robin = estimate(w, zero(stage=stage, offload_optimizer=offload(), round_robin_gradients=True))
    assert robin.to_dict() == plain.to_dict()


# --- the save phase -----------------------------------------------------------------------------------------------


def test_save_phase_only_with_zero3_and_the_gather_flag() -> None:
    w = work()
    assert "save" in PHASES
    assert "save" not in estimate(w, zero(stage=3)).phases  # DeepSpeed's default: false
    assert "save" not in estimate(w, zero(stage=2, stage3_gather_16bit_weights_on_model_save=True)).phases
    for key in (
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
    ):
        assert "save" in estimate(w, zero(stage=3, **{key: True})).phases, key


def test_save_phase_gathers_the_16bit_model_on_rank_0s_host() -> None:
    w = work()
    plain = estimate(w, zero(stage=3))
    est = estimate(w, zero(stage=3, stage3_gather_16bit_weights_on_model_save=True))
    n, largest = w.model.n_params, w.model.largest_param
    save, step = est.phases["save"], est.phases["step"]
    assert est.details["save_gathered_model"] == 2 * n
    assert save.cpu["parameters"] == 2 * n
    # The device keeps its steady state (not the step's fp32 gradients, nor activations) plus one gathered module.
    step_grads = 4 * min(est.details["partition_elements"], 1_000_000_000)
    assert save.gpu_total == step.gpu_total - step_grads + 2 * largest
    assert save.gpu["activations"] == 0
    # Only rank 0 holds the model: the node adds it once, not once per rank.
    assert est.cpu_per_node["total"] == plain.cpu_per_node["total"] + 2 * n
    assert est.cpu_per_node["parameters"] == 2 * n
    assert est.peak_phase == plain.peak_phase  # saving adds a phase after the step; the step's own peak stays
    assert {name: est.phases[name].gpu_total for name in plain.phases} == {
        name: phase.gpu_total for name, phase in plain.phases.items()
    }


def test_save_phase_with_offloaded_states_adds_to_the_steady_host() -> None:
    w = work()
    config = zero(
        stage=3, offload_optimizer=offload(), offload_param=offload(), gather_16bit_weights_on_model_save=True
    )
    est = estimate(w, config)
    steady = est.phases["step"].cpu_total
    assert est.phases["save"].cpu_total == steady + 2 * w.model.n_params
    assert est.cpu_per_node["total"] == 8 * steady + 2 * w.model.n_params + est.cpu_per_node["processes"]


def test_save_phase_on_cpu_ranks_adds_no_device_working_set() -> None:
    """On CPU ranks the gathered storages are the state_dict's own: the host holds ``e·Ψ``, nothing more."""
    est = estimate(
        work("tiny-llama", gpus=2, device="cpu"), zero(stage=3, stage3_gather_16bit_weights_on_model_save=True)
    )
    assert est.details["save_gathered_model"] == 2 * est.n_params
    assert est.details["save_working_set"] == 0


def test_save_phase_can_be_the_gpu_peak_and_is_named_when_pruned() -> None:
    w = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=1, gpu_memory=2**30))
    est = estimate(w, zero(stage=3, sub_group_size=1000, stage3_gather_16bit_weights_on_model_save=True))
    assert est.peak_phase == "save"
    reason = memory_reason(est, Calibration(margin=0.0))
    assert reason is not None and reason.phase == "save"
    assert reason_key(reason.sentence()) == "GPU memory · save · optimizer states"
    assert "at the save phase" in (est.overflow_reason() or "")


def test_save_phase_is_named_when_the_node_runs_short() -> None:
    plain = estimate(work(gpus=2), zero(stage=3))
    w = work(gpus=2, cpu_memory=plain.cpu_per_node["total"] + 2**30)
    est = estimate(w, zero(stage=3, stage3_gather_16bit_weights_on_model_save=True))
    reason = memory_reason(est, Calibration(margin=0.0))
    assert reason is not None
    assert reason_key(reason.sentence()) == "node CPU memory · save · parameters"
    assert est.to_dict()["phases"]["save"]["cpu"] == 2 * w.model.n_params
