"""The throughput model with LoRA: the backward pass still reaches the adapters through the frozen layers, while
weight gradients, their reduction, the optimizer step and offload traffic follow the trainable count (peft's, from
the profile of the model as trained)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from tuner.estimator import resolve
from tuner.estimator.throughput.flops import backward_flops_per_token, forward_flops_per_token, model_flops_per_token
from tuner.estimator.throughput.hardware import hardware_for
from tuner.estimator.throughput.prediction import predict, step_terms, trainable_params
from tuner.profile import model_from_config, with_profile
from tuner.workload import ClusterSpec, TrainableSpec, TrainSpec, TrialConfig, Workload, preset_config

ADAPTER = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
LORA_PARAMS = 4 * (8 * (128 + 128) + 8 * (128 + 64))  # tiny-llama: 4 layers of q_proj 128→128, v_proj 128→64


Pair = tuple[Workload, Workload]


@pytest.fixture(scope="module")
def pair() -> Pair:
    """tiny-llama on 2 CPU ranks: full fine-tuning and LoRA, each with its profile."""
    model = model_from_config(preset_config("tiny-llama"), "tiny-llama")
    base = Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64))
    lora = Workload(model, base.cluster, base.train, trainable=TrainableSpec.of(ADAPTER))
    return with_profile(base), with_profile(lora)


def config(stage: int, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
    }


def test_trainable_count_is_peft_s_and_full_fine_tuning_trains_everything(pair: Pair) -> None:
    full, lora = pair
    assert trainable_params(full) == full.model.n_params
    assert trainable_params(lora) == LORA_PARAMS


def test_flops_keep_activation_gradients_and_drop_frozen_weight_gradients(
    pair: Pair,
) -> None:
    full, lora = pair
    model, seq = full.model, 64
    n, t = model.n_params, LORA_PARAMS
    scores = 4 * model.num_layers * model.hidden_size * seq  # attention scores, forward
    assert forward_flops_per_token(model, seq) == 2 * n + scores
    assert backward_flops_per_token(model, seq, t) == 2 * n + 2 * t + 2 * scores
    assert model_flops_per_token(model, seq) == 6 * n + 3 * scores
    assert model_flops_per_token(model, seq, t) == 4 * n + 2 * t + 3 * scores
    ratio = predict(lora, config(2)).terms.compute / predict(full, config(2)).terms.compute
    assert ratio == pytest.approx((4 * n + 2 * t + 3 * scores) / (6 * n + 3 * scores))
    # checkpointing recomputes the forward pass only: ×4/3 for full fine-tuning, more for LoRA (a smaller backward)
    ckpt = TrialConfig(config(2), activation_checkpointing=True)
    assert predict(full, ckpt).terms.compute == pytest.approx(predict(full, config(2)).terms.compute * 4 / 3)
    extra = predict(lora, ckpt).terms.compute / predict(lora, config(2)).terms.compute
    assert extra == pytest.approx(1 + (2 * n + scores) / (4 * n + 2 * t + 3 * scores))


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_gradient_reduction_and_optimizer_step_scale_with_trainable_count(pair: Pair, stage: int) -> None:
    full, lora = pair
    full_terms, lora_terms = predict(full, config(stage)).terms, predict(lora, config(stage)).terms
    fraction = LORA_PARAMS / full.model.n_params
    # ZeRO-0 all-reduces gradients, ZeRO-1/2 reduce-scatter them and all-gather the updated parameters: trainable only
    assert lora_terms.bandwidth == pytest.approx(full_terms.bandwidth * fraction, rel=1e-3)
    assert lora_terms.memory < full_terms.memory * fraction * 1.01


def test_zero3_gathers_every_parameter_but_reduces_only_trainable_gradients(
    pair: Pair,
) -> None:
    full, lora = pair
    ds = config(3, stage3_param_persistence_threshold=0)
    full_terms, lora_terms = predict(full, ds).terms, predict(lora, ds).terms
    n, t = full.model.n_params, LORA_PARAMS
    # per micro-step: forward and backward gathers of every parameter (the base's n and the adapters' t, which
    # ZeRO-3 partitions too), gradients of the trainable t reduce-scattered
    assert lora_terms.bandwidth / full_terms.bandwidth == pytest.approx((2 * (n + t) + t) / (3 * n), rel=1e-6)
    # ZeRO-3's hooks run per parameter: the adapters' 16 add to the latency
    assert lora_terms.latency > full_terms.latency


def test_optimizer_offload_traffic_follows_the_trainable_partition(pair: Pair) -> None:
    full, lora = pair
    ds = config(2, offload_optimizer={"device": "cpu"})
    hw = hardware_for(full)
    offload = {}
    for name, work in (("full", full), ("lora", lora)):
        with_offload = step_terms(work, resolve(work, ds), hw).memory
        without = step_terms(work, resolve(work, config(2)), hw).memory
        offload[name] = with_offload - without
    assert offload["lora"] == pytest.approx(offload["full"] * LORA_PARAMS / full.model.n_params, rel=1e-3)
