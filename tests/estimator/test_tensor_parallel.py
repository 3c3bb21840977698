"""AutoTP and hpZ in the estimator (pure arithmetic): what a tensor-parallel rank holds, what ZeRO partitions over
world / tp, what stays whole, hpZ's secondary partition, and the layouts refused naming their field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.estimator.activations.saved import tp_whole_layer_bytes
from tuner.estimator.layouts.autotp import linear_sizes, shard_mask
from tuner.workload import (
    ActivationProfile,
    ClusterSpec,
    ConfigError,
    Linear,
    ModelProfile,
    ModelSpec,
    TrainSpec,
    Workload,
    load_builtin_model,
    model_from_hf_config,
    model_from_param_count,
)

H, F, V, L = 512, 1376, 8000, 4  # a llama-like model: 8 heads of 64, 4 key-value heads, SwiGLU
LLAMA = {
    "model_type": "llama",
    "vocab_size": V,
    "hidden_size": H,
    "intermediate_size": F,
    "num_hidden_layers": L,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}


def llama(tied: bool = False) -> ModelSpec:
    return model_from_hf_config({**LLAMA, "tie_word_embeddings": tied}, "llama-like")


def sharded_elements(tied: bool) -> int:
    """The Linears AutoTP shards, counted from the shapes by hand: q, o (h×h), k, v (h×h/2), gate, up, down (h×f);
    an untied head (V×h)."""
    per_layer = 2 * H * H + 2 * H * H // 2 + 3 * H * F
    return L * per_layer + (0 if tied else V * H)


def config(tp: int = 1, stage: int = 0, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
        "tensor_parallel": {"autotp_size": tp},
    }


def work(model: ModelSpec, gpus: int = 2, seq: int = 256, nodes: int = 1) -> Workload:
    return Workload(model, ClusterSpec(gpus_per_node=gpus, nodes=nodes), TrainSpec(seq_len=seq))


@pytest.mark.parametrize("tied", [False, True])
def test_a_tp_rank_holds_half_the_sharded_linears_and_every_whole_parameter(tied: bool) -> None:
    model = llama(tied)
    sharded = sharded_elements(tied)
    whole = model.n_params - sharded
    assert whole >= V * H  # the embedding, norms (and a tied head, the embedding itself) stay whole
    est = estimate(work(model), config(tp=2))  # ZeRO-0: the rank's parameters are its local model, in bf16
    assert est.details["tp_sharded_elements"] == sharded
    assert est.details["tp_local_elements"] == sharded // 2 + whole
    assert est.phases["forward"].gpu["parameters"] == 2 * (sharded // 2 + whole)
    assert est.n_params == model.n_params  # the contract's n_params stays the model's


def test_a_tied_head_stays_whole_and_an_untied_one_is_sharded() -> None:
    untied, tied = shard_mask(llama(False)), shard_mask(llama(True))
    assert untied[0] is False and tied[0] is False  # the input embedding
    assert untied[-1] is True  # the untied LM head, column-parallel
    assert len(tied) == len(untied) - 1 and tied[-1] is False  # tied: the final norm is last, whole


def test_the_profiles_split_from_the_tp_plan_wins_over_the_shapes() -> None:
    """A profiled model carries AutoTP's split as its tp_plan gives it (biased column Linears with their biases, a
    biased head: what the shapes cannot tell); the estimate shards exactly those. Without it, the shapes'."""
    model = llama()
    numels = model.param_numels
    split = tuple(index % 3 == 0 for index in range(len(numels)))  # any split: the profile's is taken as is
    profile = ModelProfile(
        model_type="llama", architecture="LlamaForCausalLM", transformers_version="5", n_params=model.n_params,
        param_numels=numels, param_elements_by_dtype={"bf16": model.n_params}, largest_param_name="x",
        largest_param_numel=max(numels), layer_kinds=("decoder",) * L, tp_sharded=split,
    )  # fmt: skip
    est = estimate(replace(work(model), profile=profile), config(tp=2))
    assert est.details["tp_local_elements"] == sum(-(-n // 2) if on else n for n, on in zip(numels, split, strict=True))
    assert est.details["tp_sharded_elements"] == sum(n for n, on in zip(numels, split, strict=True) if on)
    plain = estimate(replace(work(model), profile=replace(profile, tp_sharded=())), config(tp=2))
    assert plain.details["tp_sharded_elements"] == sharded_elements(False)
    assert ModelProfile.from_dict(profile.to_dict()).tp_sharded == split


@pytest.mark.parametrize("stage", [2, 3])
def test_tp2_dp2_halves_the_optimizer_states_of_tp2_again(stage: int) -> None:
    """ZeRO works over the data-parallel world / tp ranks; at ZeRO-3 the parameters AutoTP leaves whole are
    partitioned over every rank (zero.Init partitioned them at birth; AutoTP re-creates only the Linears it shards:
    measured on 2 CPU ranks, bench/tp_true_peak.py)."""
    model = llama()
    sharded = sharded_elements(False)
    whole = model.n_params - sharded
    states = {
        (tp, gpus): estimate(work(model, gpus), config(tp, stage, stage3_param_persistence_threshold=0))
        for tp, gpus in ((1, 2), (2, 2), (2, 4))
    }
    opt = {key: est.phases["step"].gpu["optimizer_states"] for key, est in states.items()}
    assert opt[(2, 4)] == pytest.approx(opt[(2, 2)] / 2, rel=1e-3)  # tp 2 × dp 2: halved again
    assert opt[(1, 2)] == pytest.approx(12 * model.n_params / 2, rel=1e-3)
    if stage == 2:  # tp 2 × dp 1: the rank's local model, unpartitioned; the embedding whole on both ranks
        assert opt[(2, 2)] == pytest.approx(12 * (sharded // 2 + whole), rel=1e-3)
    else:  # ZeRO-3: the whole parameters split over both ranks too
        assert states[(2, 2)].details["partition_elements"] == sharded // 2 + whole // 2
        assert opt[(2, 2)] == pytest.approx(opt[(1, 2)], rel=1e-3)


def test_activations_shard_inside_the_layers_only() -> None:
    model = load_builtin_model("llama-2-7b")
    one = estimate(work(model, 8, 4096), config(1, 3))
    two = estimate(work(model, 8, 4096), config(2, 3))
    saved = {n: e.phases["forward"].gpu["activations"] for n, e in ((1, one), (2, two))}
    assert 0.5 < saved[2] / saved[1] < 0.75  # norms and the Linears' inputs stay whole
    assert two.details["logits_workspace"] == one.details["logits_workspace"]  # the gathered logits are whole
    assert two.details["tp_allreduce_bytes"] == 2 * 4096 * 4096  # one row-parallel output, e·b·s·h


def test_traced_activations_match_the_tp_local_models_trace() -> None:
    """Saved bytes traced (transformers 5, bf16, sdpa, micro-batch 2, seq 256) from a 2-layer LLaMA (h 128, 4 heads,
    2 kv heads, f 256) and from its tp = 2 rank (2 heads, 1 kv head, f 128, head dim kept): the estimate at tp = 2
    from the whole model's trace equals the rank's own trace."""
    dims = {**LLAMA, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    base = model_from_hf_config(dims, "traced")
    entry = ActivationProfile(
        seq_len=256, precision="bf16", attention="sdpa", experts="", checkpointing=False,
        outside=Linear(0, 857_090, 1_714_180), first_extra=Linear(32_768, 0, 32_768),
        layers={"decoder": Linear(0, 1_398_784, 2_797_568)},
    )  # fmt: skip
    profile = ModelProfile(
        model_type="llama", architecture="LlamaForCausalLM", transformers_version="5", n_params=base.n_params,
        param_numels=base.param_numels, param_elements_by_dtype={"bf16": base.n_params}, largest_param_name="x",
        largest_param_numel=base.largest_param, layer_kinds=("decoder",) * 2, activations=(entry,),
    )  # fmt: skip
    model = type(base)(**{**base.to_dict(), "implementation": "transformers", "numels": base.param_numels})
    workload = Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=256), profile=profile)
    ds = {**config(2, 2), "train_micro_batch_size_per_gpu": 2}
    saved = estimate(workload, ds).phases["forward"].gpu["activations"]
    assert saved == 1_714_180 + 1_957_888 + 1_925_120  # the tp-local model's outside, first and second layer


def test_hpz_adds_a_secondary_16bit_partition_over_its_group() -> None:
    added_in = ("forward", "backward", "step")
    model = llama()
    plain = estimate(work(model, 4), config(1, 3, stage3_param_persistence_threshold=0))
    hpz = estimate(work(model, 4), config(1, 3, stage3_param_persistence_threshold=0, zero_hpz_partition_size=2))
    secondary = hpz.details["hpz_secondary_partition"]
    assert secondary == pytest.approx(2 * model.n_params / 2, rel=1e-3)  # 2Ψ / hpz in bf16
    added = {phase: hpz.phases[phase].gpu["parameters"] - plain.phases[phase].gpu["parameters"] for phase in added_in}
    # every parameter released by the end of backward has one; after forward, those kept gathered have none yet
    assert added == {"forward": 0, "backward": secondary, "step": secondary}


@pytest.mark.parametrize(
    ("model", "gpus", "ds", "field", "words"),
    [
        (llama(), 2, config(tp=4), "tensor_parallel.autotp_size", "GPUs of a node"),  # 2 nodes × 2 GPUs
        (llama(), 16, config(tp=16), "tensor_parallel.autotp_size", "attention heads"),
        (llama(), 8, config(tp=3), "tensor_parallel.autotp_size", "tp = 3 must divide the 16 ranks"),
        (llama(), 8, config(tp=8), "tensor_parallel.autotp_size", "key-value heads"),
        (model_from_param_count(1e9), 8, config(tp=2), "tensor_parallel.autotp_size", "bare parameter count"),
        (llama(), 4, config(1, 2, zero_hpz_partition_size=2), "zero_optimization.zero_hpz_partition_size", "ZeRO-3"),
        (llama(), 4, config(1, 3, zero_hpz_partition_size=3), "zero_optimization.zero_hpz_partition_size", "divide"),
    ],
)
def test_bad_layouts_are_refused_naming_the_field(
    model: ModelSpec, gpus: int, ds: dict, field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        estimate(work(model, gpus, nodes=2), ds)
    assert refused.value.field == field and words in refused.value.message


def test_autotp_on_an_moe_model_needs_a_tp_plan_deepspeed_takes() -> None:
    """Refused without the model's plan read into its profile (transformers 5.24's Qwen2-MoE plan had expert styles
    DeepSpeed rejects); with one (5.25's: attention only) the experts stay whole and their block's activations too."""
    moe = model_from_hf_config(
        {**LLAMA, "model_type": "mistral", "num_local_experts": 4, "num_experts_per_tok": 2}, "moe"
    )
    moe = type(moe)(**{**moe.to_dict(), "hf_config": '{"num_local_experts": 4}'})
    with pytest.raises(ConfigError, match="MoE") as refused:
        estimate(work(moe), config(tp=2))
    assert refused.value.field == "tensor_parallel.autotp_size"
    numels = moe.param_numels
    split = shard_mask(moe)  # the attention and MLP Linears a plan would name
    mlp = 10**6  # what one layer's MoE block saves, traced
    entry = ActivationProfile(
        seq_len=256, precision="bf16", attention="sdpa", experts="", checkpointing=False,
        outside=Linear(0, 10**6, 10**6), first_extra=Linear(), layers={"decoder": Linear(0, 5 * mlp, 5 * mlp)},
        mlp_saved=Linear(0, mlp, mlp),
    )  # fmt: skip
    profile = ModelProfile(
        model_type="mistral", architecture="MixtralForCausalLM", transformers_version="5", n_params=moe.n_params,
        param_numels=numels, param_elements_by_dtype={"bf16": moe.n_params}, largest_param_name="x",
        largest_param_numel=max(numels), layer_kinds=("decoder",) * L, tp_sharded=split, activations=(entry,),
    )  # fmt: skip
    taken = replace(work(replace(moe, implementation="transformers")), profile=profile)
    one, two = estimate(taken, config(tp=1)), estimate(taken, config(tp=2))
    assert two.details["tp_local_elements"] < moe.n_params
    whole = tp_whole_layer_bytes(moe, 1, 256, 2, traced=True) + mlp  # norms, column inputs and the MoE block
    kernels = one.details["attention_kernel_extra"] - two.details["attention_kernel_extra"]  # CUDA: a rank's heads
    saved = one.phases["forward"].gpu["activations"] - two.phases["forward"].gpu["activations"] - kernels
    assert saved == L * (5 * mlp - whole) // 2
    both = {**config(tp=2), "expert_parallel": {"enabled": True, "autoep_size": 2}}  # DeepSpeed's folding
    with pytest.raises(ConfigError, match="AutoEP") as refused:
        estimate(taken, both)
    assert refused.value.field == "tensor_parallel.autotp_size"


def test_an_unset_mlp_width_is_gpt2s_4h() -> None:
    """transformers' GPT-2 config leaves ``n_inner`` unset, so a profile's ``intermediate_size`` is 0: its MLP is 4h."""
    gpt2 = load_builtin_model("gpt2")
    assert linear_sizes(replace(gpt2, intermediate_size=0)) == linear_sizes(gpt2)
    assert sum(n for n, on in zip(gpt2.param_numels, shard_mask(gpt2), strict=True) if on) == 12 * 12 * 768 * 768


def test_throughput_counts_the_rank_shards_and_the_tp_all_reduces() -> None:
    from tuner.estimator import predict, resolve
    from tuner.estimator.layouts.autotp import tensor_parallel_seconds
    from tuner.estimator.throughput.hardware import hardware_for

    w = work(load_builtin_model("llama-2-7b"), 8, 4096)
    one, two = predict(w, config(1, 3)), predict(w, config(2, 3))
    assert two.terms.compute < 0.6 * one.terms.compute  # a rank multiplies through half the Linears
    seconds, calls = tensor_parallel_seconds(w, resolve(w, config(2, 3)), hardware_for(w))
    assert calls == 2 * 2 * 32  # attention and MLP outputs, forward and backward, 32 layers
    assert seconds > 0 and two.terms.bandwidth > seconds  # ZeRO's traffic beside them
