"""Ulysses and ALST in the estimator (pure arithmetic): what scales with a rank's s/sp tokens, what does not, and
where each ALST piece moves bytes. The estimate against real DeepSpeed runs is test_sp_true_peak.py's (slow)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.estimator.activations.saved import activation_bytes, logits_workspace_bytes
from tuner.estimator.layouts.ulysses import (
    all_to_all_buffers,
    attention_output_bytes,
    kv_replication_bytes,
    mlp_saved_bytes,
)
from tuner.workload import (
    ActivationProfile,
    ClusterSpec,
    Linear,
    ModelProfile,
    TrainSpec,
    TrialConfig,
    Workload,
    load_builtin_model,
    model_from_hf_config,
)

SEQ = 8192


def llama(gpus: int = 8, seq: int = SEQ) -> Workload:
    return Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=gpus), TrainSpec(seq_len=seq))


def config(sp: int = 1, stage: int = 3, **dstune: object) -> dict:
    ds: dict = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}
    ds["sequence_parallel_size"] = sp
    if dstune:
        ds["dstune"] = dstune
    return ds


def test_activations_are_the_model_at_s_over_sp() -> None:
    work = llama()
    model = work.model
    one, two = estimate(work, config(1)), estimate(work, config(2))
    saved, _ = activation_bytes(model, 1, SEQ // 2, 2, "sdpa", False)
    kernel = two.details["attention_kernel_extra"]  # CUDA's RNG blocks, a rank's h/sp heads
    output = two.details["ulysses_attention_output"]  # o_proj's input, a storage of its own under Ulysses
    assert output == attention_output_bytes(model, 1, SEQ // 2, 2) == 2 * (SEQ // 2) * 4096
    ulysses = model.num_layers * output
    assert two.phases["forward"].gpu["activations"] - kernel - ulysses == saved  # 32 kv heads: nothing replicated
    assert two.details["logits_workspace"] == logits_workspace_bytes(model, 1, SEQ // 2, 2)
    ratio = (two.phases["forward"].gpu["activations"] - ulysses) / one.phases["forward"].gpu["activations"]
    assert ratio == pytest.approx(0.5, abs=1e-3)


def test_model_states_shard_over_sp_times_dp_and_gradients_reduce_in_fp32() -> None:
    """DeepSpeed partitions ZeRO over seq_dp_world_size = every rank; under Ulysses the reduce bucket is fp32."""
    work = llama()
    one, two = estimate(work, config(1)), estimate(work, config(2))
    for category in ("parameters", "optimizer_states"):
        assert two.phases["step"].gpu[category] == one.phases["step"].gpu[category]
    assert two.details["reduce_buckets"] == 2 * one.details["reduce_buckets"]  # bf16 → fp32 elements


def test_profiles_traced_at_s_are_scaled_to_a_rank_tokens() -> None:
    """Without a trace at s/sp, the profile's entry at s scales by 1/sp (saved bytes are linear in the tokens)."""
    entry = ActivationProfile(
        seq_len=SEQ, precision="bf16", attention="sdpa", experts="", checkpointing=False,
        outside=Linear(0, 1000, 1000), first_extra=Linear(0, 0, 0), layers={"decoder": Linear(0, 4000, 4000)},
    )  # fmt: skip
    work = _traced(entry, ClusterSpec(gpus_per_node=4))
    est = estimate(work, config(4))
    layers = work.model.num_layers
    saved = est.phases["forward"].gpu["activations"] - est.details["attention_kernel_extra"]
    assert saved - layers * est.details["ulysses_attention_output"] == (1000 + layers * 4000) // 4


def _dims(model: object) -> dict:
    return {
        "vocab_size": model.vocab_size,  # type: ignore[attr-defined]
        "hidden_size": model.hidden_size,  # type: ignore[attr-defined]
        "intermediate_size": model.intermediate_size,  # type: ignore[attr-defined]
        "num_hidden_layers": model.num_layers,  # type: ignore[attr-defined]
        "num_attention_heads": model.num_heads,  # type: ignore[attr-defined]
    }


def test_fewer_kv_heads_than_sp_are_replicated() -> None:
    gqa = model_from_hf_config(
        {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 2},
        "gqa",
    )  # fmt: skip
    assert kv_replication_bytes(gqa, 1, SEQ, 2, 2) == 0
    # sp 8 over 2 kv heads: a rank keeps one whole key and value head over s instead of 2/8 of one
    assert kv_replication_bytes(gqa, 1, SEQ, 2, 8) == 2 * 2 * SEQ * 128 * 6 // 8
    work = Workload(gqa, ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=SEQ))
    assert estimate(work, config(8)).details["kv_replicated"] == kv_replication_bytes(gqa, 1, SEQ, 2, 8)
    # the all-to-all carries q heads and the replicated kv heads: (s/sp)·d·(q + 2·sp)·e, packed and received
    assert all_to_all_buffers(gqa, 1, SEQ // 8, 2, 8) == 2 * 2 * (SEQ // 8) * 128 * (32 + 16)


def test_tiled_mlp_drops_the_mlp_intermediates_and_holds_one_shard_in_backward() -> None:
    work = llama()
    plain, tiled = estimate(work, config(2)), estimate(work, config(2, tiled_mlp_shards=4))
    dropped = mlp_saved_bytes(work.model, SEQ // 2, 2)
    assert dropped == 4 * 2 * (SEQ // 2) * 11008
    fwd = plain.phases["forward"].gpu["activations"] - tiled.phases["forward"].gpu["activations"]
    assert fwd == work.model.num_layers * dropped
    assert tiled.details["tiled_mlp_shard"] == dropped // 4


def test_a_traced_mlp_block_is_what_the_tiled_mlp_drops() -> None:
    """Where the profile traced what a layer's MLP block saves (an MoE block keeps more than the formula knows: the
    routed outputs its routing weights scale), the tiled MLP drops that; without it, the formula."""
    mlp = 3 * 10**8
    entry = ActivationProfile(
        seq_len=SEQ // 2, precision="bf16", attention="sdpa", experts="", checkpointing=False,
        outside=Linear(0, 1000, 1000), first_extra=Linear(), layers={"decoder": Linear(0, 10**9, 10**9)},
        mlp_saved=Linear(0, mlp, mlp),
    )  # fmt: skip
    work = _traced(entry)
    tiled = estimate(work, config(2, tiled_mlp_shards=4))
    plain = estimate(work, config(2))
    dropped = plain.phases["forward"].gpu["activations"] - tiled.phases["forward"].gpu["activations"]
    assert dropped == work.model.num_layers * mlp and tiled.details["tiled_mlp_shard"] == mlp // 4
    untraced = replace(work, profile=replace(work.profile, activations=(replace(entry, mlp_saved=Linear()),)))
    formula = mlp_saved_bytes(work.model, SEQ // 2, 2)
    assert estimate(untraced, config(2, tiled_mlp_shards=4)).details["tiled_mlp_shard"] == formula // 4


def test_tiled_loss_never_holds_the_full_logits() -> None:
    work = llama()
    plain, tiled = estimate(work, config(2)), estimate(work, config(2, tiled_loss_shards=8))
    tokens, vocab, hidden = SEQ // 2, work.model.vocab_size, work.model.hidden_size
    # a shard's backward: three fp32 shard-logits tensors (measured inside the shard function, sp_true_peak)
    assert tiled.details["logits_workspace"] == 3 * 4 * tokens * vocab // 8
    assert tiled.details["logits_workspace"] < plain.details["logits_workspace"] / 4
    saved = plain.phases["forward"].gpu["activations"] - tiled.phases["forward"].gpu["activations"]
    assert saved == 4 * tokens * vocab - 2 * tokens * hidden  # the fp32 log-softmax out, the input's gradient in


def test_offloaded_checkpoints_live_in_host_memory() -> None:
    work = llama(seq=32768)
    ds = config(8, tiled_loss_shards=8)
    on_device = estimate(work, ds)
    kept = estimate(work, TrialConfig(ds, True))
    offloaded = estimate(
        work, TrialConfig({**ds, "dstune": {"tiled_loss_shards": 8, "offload_checkpoints": True}}, True)
    )
    checkpoint = 2 * (32768 // 8) * work.model.hidden_size
    layers = work.model.num_layers
    assert offloaded.details["offloaded_checkpoints"] == layers * checkpoint
    assert offloaded.cpu_per_node["activations"] >= 8 * layers * checkpoint  # 8 ranks per node (pinned: rounded)
    moved = kept.phases["forward"].gpu["activations"] - offloaded.phases["forward"].gpu["activations"]
    assert moved == (layers - 2) * checkpoint  # the layer recomputed and the next fetched stay on the device
    assert on_device.phases["forward"].gpu["activations"] > kept.phases["forward"].gpu["activations"]


def _recomputed_entry(saved: int, peak: int, outside_mlp: int) -> ActivationProfile:
    """A checkpointed trace whose recomputed layer saves ``saved`` bytes and peaks at ``peak`` in its backward
    (``outside_mlp`` outside its MLP), per sample at s/sp."""
    return ActivationProfile(
        seq_len=SEQ // 2, precision="bf16", attention="sdpa", experts="", checkpointing=True,
        outside=Linear(0, 1000, 1000), first_extra=Linear(0, 0, 0), layers={"decoder": Linear(0, 4000, 4000)},
        recompute=Linear(0, saved, saved), backward_peak=Linear(0, peak, peak),
        backward_peak_outside_mlp=Linear(0, outside_mlp, outside_mlp),
    )  # fmt: skip


def test_a_recomputed_layer_holds_its_worst_backward_moment() -> None:
    """With checkpointing, the recomputed layer's traced worst moment in backward replaces its saved bytes where
    larger: all of it without tiling, the moment outside the MLP under a tiled MLP (whose shards replace the MLP's)."""
    saved, peak, outside_mlp = 10**9, 14 * 10**8, 12 * 10**8  # per sample, at s/sp
    entry = _recomputed_entry(saved, peak, outside_mlp)
    work = _traced(entry)
    profile, model = work.profile, work.model
    assert profile is not None

    def recomputed(**dstune: object) -> int:
        ds = config(2, **dstune)
        return estimate(work, TrialConfig(ds, activation_checkpointing=True)).details["recomputed_block"]

    assert recomputed() == peak
    shard = -(-mlp_saved_bytes(model, SEQ // 2, 2) // 4)
    assert saved - mlp_saved_bytes(model, SEQ // 2, 2) + shard < outside_mlp
    assert recomputed(tiled_mlp_shards=4) == outside_mlp
    # without a traced moment (an older profile, a layer that cannot run alone) the saved bytes stand
    bare = replace(entry, backward_peak=Linear(), backward_peak_outside_mlp=Linear())
    work = replace(work, profile=replace(profile, activations=(bare,)))
    assert recomputed() == saved + attention_output_bytes(model, 1, SEQ // 2, 2)


def test_a_buckets_reduction_is_not_at_the_recomputed_layers_worst_moment() -> None:
    """ZeRO 1-3 reduce a bucket inside a gradient hook, between autograd ops; the recomputed layer's worst moment is
    inside one. The backward phase holds the larger of that moment and the layer's saved tensors beside the staging,
    not both at once (counting both was 8.3 % over the true peak at ZeRO-3, ``bench/sp_true_peak.py``)."""
    saved, peak = 10**9, 14 * 10**8
    work = _traced(_recomputed_entry(saved, peak, peak))
    for stage in (1, 2, 3):
        est = estimate(work, TrialConfig(config(2, stage), activation_checkpointing=True))
        staging = est.details["reduce_copy"]
        assert staging > 0 and est.details["recomputed_block"] == peak
        layer_saved = saved + est.details["ulysses_attention_output"]
        assert est.details["recomputed_block_beside_staging"] == max(peak - staging, layer_saved)
    # ZeRO-0 all-reduces after backward: no staging inside it, the worst moment stands
    est = estimate(work, TrialConfig(config(2, 0), activation_checkpointing=True))
    assert "reduce_copy" not in est.details and "recomputed_block_beside_staging" not in est.details


def _traced(entry: ActivationProfile, cluster: ClusterSpec | None = None) -> Workload:
    """LLaMA-2-7B at :data:`SEQ` (on 2 CPU ranks unless ``cluster`` says), carrying a profile of the one activation
    ``entry``."""
    base = load_builtin_model("llama-2-7b")
    profile = ModelProfile(
        model_type="llama", architecture="LlamaForCausalLM", transformers_version="5", n_params=base.n_params,
        param_numels=base.param_numels, param_elements_by_dtype={"bf16": base.n_params}, largest_param_name="x",
        largest_param_numel=base.largest_param, layer_kinds=("decoder",) * base.num_layers, activations=(entry,),
    )  # fmt: skip
    model = model_from_hf_config({"model_type": "llama", **_dims(base)}, "traced")
    model = type(model)(**{**model.to_dict(), "implementation": "transformers", "numels": base.param_numels})
    cluster = cluster or ClusterSpec(gpus_per_node=2, device="cpu")
    return Workload(model, cluster, TrainSpec(seq_len=SEQ), profile=profile)


def test_forward_holds_its_largest_traced_moment() -> None:
    """Without checkpointing the forward phase holds the largest of the loss's moment (saved activations and the
    logits workspace), the first layer's backward on top of every layer's saved tensors (the head's and loss's are
    freed), and what the model builds before its first layer."""
    layer, outside = 10**8, 3 * 10**8
    entry = ActivationProfile(
        seq_len=SEQ // 2, precision="bf16", attention="sdpa", experts="", checkpointing=False,
        outside=Linear(0, outside, outside), first_extra=Linear(), layers={"decoder": Linear(0, layer, layer)},
    )  # fmt: skip
    work = _traced(entry)
    n = work.model.num_layers
    plain = estimate(work, config(2))
    saved, workspace = plain.phases["forward"].gpu["activations"], plain.details["logits_workspace"]
    layer += plain.details["ulysses_attention_output"]
    assert saved == n * layer + outside and "forward_moment_extra" not in plain.details

    def forward(**fields: Linear) -> int:
        est = estimate(replace(work, profile=replace(work.profile, activations=(replace(entry, **fields),))), config(2))
        return est.phases["forward"].gpu["activations"] + workspace

    excess = outside + workspace + 7 * 10**8  # a layer's backward beyond what it saved (eager scores' gradients)
    assert forward(backward_excess=Linear(0, excess, excess)) == n * layer + excess
    small = outside + workspace - 1  # within the loss's moment: nothing added
    assert forward(backward_excess=Linear(0, small, small)) == saved + workspace
    mask = saved + workspace + 5 * 10**8  # a mask built before the first layer
    assert forward(pre_layer_peak=Linear(mask, 0, mask)) == mask
    held = workspace + 10**8  # a mask held through the layers, larger than the logits workspace
    assert forward(pre_layer_held=Linear(held, 0, held)) == saved + held


def test_zero0s_step_on_an_sp_rank_above_0_holds_the_norms_duplicate_mask() -> None:
    """FP16_Optimizer's gradient norm masks every parameter as a model-parallel duplicate on sp ranks above 0: a
    zeros tensor, its cumsum and their bool over the flat fp32 gradient (9 B an element at once), the 16-bit
    gradients released; the counting allocator's step peak of such a rank (sp_true_peak.md's ZeRO-0 rows)."""
    n = llama().model.n_params
    plain, ulysses = estimate(llama(), config(1, stage=0)), estimate(llama(), config(2, stage=0))
    assert plain.details["step_temporaries"] == 4 * n  # the fp32 copies concatenated
    assert ulysses.details["step_temporaries"] == 9 * (n + 1) - 2 * n
