"""AutoEP in the estimator and the layout checks (pure arithmetic): what an expert-parallel rank holds, what ZeRO
partitions over the world / ep expert-data-parallel ranks, the all-to-all in the throughput model, and the layouts
refused naming their field.

The model is a hand-built Mixtral-shaped ModelSpec (transformers 5's fused expert weights, in the order the meta
device lists them), so no torch is needed; its element counts are the ones ``bench/autoep_check.py`` measured on the
tiny Mixtral (164,672 parameters, 127,808 per rank with AutoEP 2)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tuner.estimator import estimate, resolve
from tuner.estimator.layouts.autoep import (
    ep_flat_partition,
    ep_workload,
    expert_mask,
    expert_parallel_seconds,
    local_layout,
    moe_layers,
)
from tuner.estimator.throughput.hardware import hardware_for
from tuner.estimator.throughput.prediction import step_terms
from tuner.workload import (
    ClusterSpec,
    ConfigError,
    ModelSpec,
    TrainableSpec,
    TrainSpec,
    TrialConfig,
    Workload,
    check_layout,
    expert_parallel_problem,
    load_builtin_model,
    model_from_param_count,
)

E, F, H, V = 4, 48, 64, 512
CONFIG = {"model_type": "mixtral", "num_local_experts": E, "intermediate_size": F, "num_experts_per_tok": 2}
LAYER = (H, H * H, H * 32, H * 32, H * H, H, E * H, E * 2 * F * H, E * F * H)  # norm, q k v o, norm, router, experts
NUMELS = (V * H, *LAYER, *LAYER, H, V * H)


def mixtral(experts: int = E, model_type: str = "mixtral") -> ModelSpec:
    config = {**CONFIG, "model_type": model_type, "num_local_experts": experts}
    return ModelSpec(
        "tiny-mixtral", model_type, vocab_size=V, hidden_size=H, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=F, tie_embeddings=False, hf_config=json.dumps(config), numels=NUMELS,
    )  # fmt: skip


def work(world: int = 2, nodes: int = 1, model: ModelSpec | None = None) -> Workload:
    cluster = ClusterSpec(gpus_per_node=world // nodes, nodes=nodes, device="cpu", gpu_memory=64 * 2**30)
    return Workload(model or mixtral(), cluster, TrainSpec(seq_len=64, precision="bf16"))


def ds(stage: int, ep: int = 1, **zero: object) -> dict:
    config: dict = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
    }
    if ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    return config


def test_a_rank_holds_its_experts_as_autoep_splits_them() -> None:
    model = mixtral()
    assert model.n_params == 164_672 and sum(expert_mask(model)) == 4 and moe_layers(model) == 2
    numels, experts = local_layout(model, 2)
    # gate_up (E·2f·h) becomes w1 and w3, down (E·f·h) w2: three E/ep·f·h weights per layer
    assert [n for n, on in zip(numels, experts, strict=True) if on] == [2 * F * H] * 6
    assert sum(numels) == 127_808  # measured per rank (bench/results/autoep_check.md)
    est = estimate(work(), ds(2, ep=2))
    assert est.details["ep_local_elements"] == 127_808 and est.details["ep_local_experts"] == 2
    assert est.n_params == 164_672  # the model's, not the rank's


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_partitions_dense_over_the_world_and_experts_over_world_over_ep(stage: int) -> None:
    s = resolve(work(4), ds(stage, ep=2))
    numels, experts = local_layout(mixtral(), 2)
    flat = ep_flat_partition(numels, experts, s)
    dense = sum(n for n, on in zip(numels, experts, strict=True) if not on)
    expert = sum(n for n, on in zip(numels, experts, strict=True) if on)
    assert flat.partition == pytest.approx(dense / 4 + expert / 2, abs=8)
    plain, ep = estimate(work(4), ds(stage)), estimate(work(4), ds(stage, ep=2))
    # parameters: every rank holds the dense part and half the experts; Adam's 12 B over the groups' partitions
    assert ep.per_gpu["parameters"] == pytest.approx(2 * (dense + expert), abs=64)
    assert plain.per_gpu["parameters"] == pytest.approx(2 * 164_672, abs=64)
    assert ep.per_gpu["optimizer_states"] == pytest.approx(12 * (dense / 4 + expert / 2), abs=200)


def test_zero3_partitions_experts_over_the_expert_data_parallel_group() -> None:
    est = estimate(work(4), ds(3, ep=2, stage3_param_persistence_threshold=0))
    numels, experts = local_layout(mixtral(), 2)
    dense = sum(n for n, on in zip(numels, experts, strict=True) if not on)
    expert = sum(n for n, on in zip(numels, experts, strict=True) if on)
    assert est.details["partition_elements"] == pytest.approx(dense / 4 + expert / 2, abs=32)


def test_the_all_to_all_is_in_the_throughput_model() -> None:
    gpu = replace(work(8), cluster=ClusterSpec(gpus_per_node=8))
    hw = hardware_for(gpu, "NVIDIA H100 80GB HBM3")
    s = resolve(gpu, ds(2, ep=4))
    seconds, calls = expert_parallel_seconds(ep_workload(gpu, s), s, hw)
    assert calls == 2 * 2 * 2  # 2 MoE layers × (dispatch + combine) × (forward + backward)
    rows = 64 * 2  # tokens × top-k, bf16, h = 64; 3/4 of it leaves the rank
    assert seconds == pytest.approx(calls * 2 * rows * H * 3 / 4 / hw.intra_bw)
    plain, ep = step_terms(gpu, resolve(gpu, ds(2)), hw), step_terms(gpu, s, hw)
    assert ep.latency == pytest.approx(plain.latency + calls * hw.collective_s)
    assert ep.compute == pytest.approx(plain.compute)  # the rows move, the work does not


EP = "expert_parallel.autoep_size"
REFUSED = [
    (work(), {"autoep_size": 3}, EP, "routed experts"),
    (work(2, model=mixtral(8)), {"autoep_size": 4}, EP, "4 must divide the 2 ranks"),
    (work(model=load_builtin_model("tiny-llama")), {"autoep_size": 2}, EP, "MoE model"),
    (work(model=mixtral(model_type="olmoe")), {"autoep_size": 2}, EP, "no preset"),
    (work(), {"autoep_size": 2, "expert_tensor_parallel_size": 2}, "expert_tensor_parallel_size", "must be 1"),
    (work(), {"autoep_size": 2, "load_balance_coeff": 0.01}, "load_balance_coeff", "null"),
]


@pytest.mark.parametrize(("workload", "config", "field", "words"), REFUSED)
def test_layouts_deepspeed_refuses_name_their_field(workload: Workload, config: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_layout(workload, TrialConfig({"expert_parallel": {"enabled": True, **config}}))
    assert error.value.field.endswith(field) and words in str(error.value)
    with pytest.raises(ConfigError):
        estimate(workload, {"expert_parallel": {"enabled": True, **config}})


@pytest.mark.parametrize(
    ("zero", "field"),
    [
        ({"zero_hpz_partition_size": 2}, "zero_optimization.zero_hpz_partition_size"),
        ({"zero_quantized_gradients": True}, "zero_optimization.zero_quantized_gradients"),
    ],
)
def test_zero3_refusals_of_autoep(zero: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_layout(work(4), TrialConfig(ds(3, ep=2, **zero)))
    assert error.value.field == field


def test_disabled_or_degree_one_is_no_autoep() -> None:
    assert TrialConfig({"expert_parallel": {"autoep_size": 2}}).layout.expert_parallel == 1  # not enabled
    assert TrialConfig({"expert_parallel": {"autoep_size": 1}}).deepspeed_config() == {}
    check_layout(work(model=load_builtin_model("tiny-llama")), TrialConfig({"expert_parallel": {"autoep_size": 2}}))


def test_the_degrees_offered_divide_the_experts_and_the_ranks() -> None:
    assert [ep for ep in (1, 2, 4, 8) if expert_parallel_problem(work(8, model=mixtral(8)), ep) is None] == [1, 2, 4, 8]
    assert [ep for ep in (1, 2, 4, 8) if expert_parallel_problem(work(4), ep) is None] == [1, 2, 4]
    assert [ep for ep in (1, 2, 4, 8) if expert_parallel_problem(work(2), ep) is None] == [1, 2]


def test_what_the_estimator_does_not_model_is_refused() -> None:
    lora = TrainableSpec(freeze="experts")
    with pytest.raises(ConfigError, match=r"expert_parallel\.autoep_size"):
        estimate(replace(work(), trainable=lora), ds(2, ep=2))
    with pytest.raises(ConfigError):
        estimate(work(model=model_from_param_count(1e6)), ds(2, ep=2))


def test_backward_holds_a_moe_layers_gradient_rows_sent_and_received() -> None:
    est = estimate(work(), ds(2, ep=2))
    assert est.details["ep_dispatch_bytes"] == 2 * 64 * 2 * H  # bf16 × tokens × top-k × hidden
    assert est.details["ep_all_to_all"] == 2 * est.details["ep_dispatch_bytes"]
    assert "ep_all_to_all" not in estimate(work(), ds(2)).details
