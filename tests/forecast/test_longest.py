"""The longest sequence that fits (tuner.forecast.longest) over the real estimator, on presets: the search against a
linear scan, pins, the next limit, multiples, refusals and the profile extrapolation it relies on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuner.estimator import estimate
from tuner.forecast.longest import NoLengthFits, longest_fit
from tuner.forecast.seq_candidates import AUTO, Candidate, Pins, candidates, sp_degrees
from tuner.forecast.seq_scaling import SeqSizer
from tuner.workload import (
    ActivationProfile,
    ClusterSpec,
    Linear,
    ModelProfile,
    TrialConfig,
    Workload,
    load_builtin_model,
)


def _work(model: str = "llama-2-7b", gpus: int = 1, **cluster: int) -> Workload:
    return Workload(load_builtin_model(model), ClusterSpec(gpus_per_node=gpus, **cluster))


def _fits(work: Workload, pins: Pins, candidate: Candidate, seq_len: int) -> bool:
    at = SeqSizer(work).at(seq_len)
    return estimate(at, candidate.trial(at, seq_len, pins)).fits


def test_the_answer_fits_and_one_step_more_does_not() -> None:
    work = _work()
    answer = longest_fit(work)
    assert answer.estimate.fits and answer.seq_len % 256 == 0
    assert answer.estimate.gpu_total <= work.cluster.gpu_memory
    assert not _fits(work, Pins(), answer.candidate, answer.seq_len + answer.multiple)
    assert answer.next_limit.seq_len == answer.seq_len + answer.multiple
    assert answer.next_limit.memory == "gpu" and answer.next_limit.short_by > 0
    nxt = SeqSizer(work).at(answer.next_limit.seq_len)
    after = estimate(nxt, answer.candidate.trial(nxt, nxt.train.seq_len, Pins()))
    grown = {name: (after.per_gpu[name] or 0) - (answer.estimate.per_gpu[name] or 0) for name in after.per_gpu}
    del grown["total"]
    top = max(grown, key=grown.__getitem__)
    assert answer.next_limit.category is not None and answer.next_limit.category.split(":")[0] == top
    assert answer.next_limit.short_by == -after.headroom


def test_search_equals_a_linear_scan_for_one_pinned_candidate() -> None:
    """Galloping and bisection find what trying every multiple of 256 finds (memory is monotone in the length)."""
    work = _work("qwen2-1.5b", gpu_memory=40 * 2**30)
    pins = Pins(stage=2, offload_optimizer="none", activation_checkpointing=False, sp=1,
                tiled_mlp_shards=1, tiled_loss_shards=1, offload_checkpoints=False)  # fmt: skip
    (only,) = candidates(work, pins)
    answer = longest_fit(work, pins)
    scanned = 0
    for k in range(1, 400):
        if not _fits(work, pins, only, 256 * k):
            break
        scanned = 256 * k
    assert scanned > 0 and answer.seq_len == scanned
    assert answer.estimates < 40  # a linear scan took scanned/256 + 1


def test_pins_restrict_the_candidates_and_never_lengthen_the_answer() -> None:
    work = _work(gpus=8)
    free = longest_fit(work)
    pinned = longest_fit(work, Pins(stage=2, activation_checkpointing=False))
    assert pinned.trial.stage == 2 and not pinned.trial.activation_checkpointing
    assert pinned.candidates < free.candidates
    assert pinned.seq_len < free.seq_len  # checkpointing is what long sequences need most
    assert free.trial.activation_checkpointing


def test_micro_batch_pin_and_a_user_ds_config_win() -> None:
    work = _work(gpus=2)
    two = longest_fit(work, Pins(micro_batch=2, ds_config={"zero_optimization": {"stage": 1}}))
    assert two.trial.batch[0] == 2 and two.trial.stage == 1
    one = longest_fit(work, Pins(ds_config={"zero_optimization": {"stage": 1}}))
    assert two.seq_len < one.seq_len


def test_multiple_of_what_the_layout_needs() -> None:
    """A pinned sp of 3 (6 ranks, 24 heads) makes the answer a multiple of lcm(256, 3) = 768."""
    model = replace(load_builtin_model("tiny-llama"), num_heads=24, num_kv_heads=24)
    work = Workload(model, ClusterSpec(gpus_per_node=6, gpu_memory=8 * 2**30))
    assert 3 in sp_degrees(work) and 4 not in sp_degrees(work)
    try:
        answer = longest_fit(work, Pins(sp=3))
    except NoLengthFits as error:  # an estimator that refuses this layout says why, naming the key
        assert "sequence_parallel" in str(error) or "heads" in str(error)
        return
    assert answer.multiple == 768 and answer.seq_len % 768 == 0
    assert answer.trial.layout.sequence_parallel == 3


def test_a_cpu_limit_is_named() -> None:
    """With everything offloaded and a small host, the host runs out first."""
    work = _work(cpu_memory=160 * 2**30)
    pins = Pins(stage=3, offload_optimizer="cpu", offload_param="cpu", activation_checkpointing=True)
    try:
        answer = longest_fit(work, pins)
    except NoLengthFits as error:
        assert "CPU memory" in str(error)
        return
    assert answer.next_limit.memory in ("gpu", "cpu")
    tight = replace(work, cluster=replace(work.cluster, cpu_memory=answer.estimate.cpu_per_node["total"]))
    with pytest.raises(NoLengthFits):
        longest_fit(replace(tight, cluster=replace(tight.cluster, cpu_memory=2**30)), pins)


def test_refused_everywhere_is_one_line_naming_the_key() -> None:
    with pytest.raises(NoLengthFits, match="offload_optimizer"):
        longest_fit(_work(), Pins(stage=0, offload_optimizer="cpu"))


def test_nothing_fits_says_why() -> None:
    with pytest.raises(NoLengthFits, match="nothing fits even at 256 tokens"):
        longest_fit(_work("llama-3.1-70b", gpu_memory=8 * 2**30, cpu_memory=64 * 2**30))


def test_a_margin_shortens_the_answer() -> None:
    work = _work()
    plain = longest_fit(work)
    margin = longest_fit(work, margin=0.1)
    assert margin.seq_len < plain.seq_len and margin.estimate.gpu_total * 1.1 <= margin.estimate.gpu_memory


def test_beyond_the_positions_is_said_not_capped() -> None:
    answer = longest_fit(_work())
    assert answer.max_positions == 4096 and answer.seq_len > 4096
    assert answer.beyond_max_positions and any("max_position_embeddings" in note for note in answer.notes())


def test_unmodelled_settings_tie_and_the_simplest_wins() -> None:
    answer = longest_fit(_work(gpus=8))
    if answer.modelled["tiled_mlp"] is False:
        assert answer.candidate.tiled_mlp == 1
    if answer.modelled["sequence_parallel"] is False:
        assert answer.candidate.sp == 1 and answer.tied >= 1
    data = answer.to_dict()
    assert data["seq_len"] == answer.seq_len and data["next_limit"]["seq_len"] > answer.seq_len


def test_candidates_cover_the_layouts_and_alst_settings() -> None:
    work = _work(gpus=8)
    pool = list(candidates(work, Pins()))
    assert {c.sp for c in pool} == {1, 2, 4, 8}
    assert {c.stage for c in pool} == {0, 1, 2, 3}
    assert any(c.tiled_mlp == AUTO and c.tiled_loss == AUTO and c.offload_checkpoints for c in pool)
    assert not any(c.offload_checkpoints and not c.activation_checkpointing for c in pool)
    trial = next(c for c in pool if c.tiled_mlp == AUTO and c.sp == 8).trial(work, 2**20, Pins())
    assert trial.layout.sequence_parallel == 8
    assert trial.long_context.tiled_mlp_shards == 2**20 // 8 // 4096  # shards of about the hidden size
    assert trial.long_context.tiled_loss_shards == 4 * 2**17 * 32000 // 2**30 + 1  # ≤ 1 GiB of fp32 logits


def _entry(seq: int, scale: int, checkpointing: bool = False) -> ActivationProfile:
    """A made-up entry whose bytes are quadratic in the length (eager attention's scores)."""
    quad = seq * seq // 64 + 3 * seq
    return ActivationProfile(seq, "bf16", "eager", "", checkpointing, Linear(4, scale * seq, scale * seq + 12),
                             Linear(seq, 0, seq), {"L0": Linear(0, quad, quad)}, Linear())  # fmt: skip


def test_sizer_extrapolates_polynomials_exactly() -> None:
    base = _work("tiny-llama")
    assert SeqSizer(base).at(8192).train.seq_len == 8192 and SeqSizer(base).at(8192).profile is None
    traced = [_entry(s, 7) for s in (1024, 2048, 4096)]
    profile = _profile_with(traced)
    sizer = SeqSizer(replace(base, profile=profile), (1, 4))
    far = sizer.at(65536).profile
    assert far is not None
    assert far.activation(65536, "bf16", "eager", False) == _entry(65536, 7)
    assert far.activation(16384, "bf16", "eager", False) == _entry(16384, 7)  # the length per rank at sp=4
    assert sizer.traced_lengths == (1024, 2048, 4096)


def _profile_with(entries: list[ActivationProfile]) -> ModelProfile:
    return ModelProfile(
        model_type="llama", architecture="LlamaForCausalLM", transformers_version="x", n_params=10,
        param_numels=(10,), param_elements_by_dtype={"bf16": 10}, largest_param_name="w", largest_param_numel=10,
        layer_kinds=("L0",), attention="eager", activations=tuple(entries),
    )  # fmt: skip


def test_an_estimator_that_models_ulysses_makes_the_search_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure search logic, with a stand-in for the SP estimator another branch brings: each rank's activations and
    logits of s/sp tokens (the real estimator at s/sp). The search then finds that sp = 8 reaches furthest, sets it
    in the config and says Ulysses is modelled."""
    import tuner.forecast.longest as longest

    real = longest.estimate

    def per_rank(workload: Workload, trial: TrialConfig):  # type: ignore[no-untyped-def]
        sp = trial.layout.sequence_parallel
        local = replace(workload, train=replace(workload.train, seq_len=workload.train.seq_len // sp))
        return real(local, trial)

    monkeypatch.setattr(longest, "estimate", per_rank)
    work = _work(gpus=8)
    answer = longest_fit(work)
    plain = longest_fit(work, Pins(sp=1))
    assert answer.modelled["sequence_parallel"] is True
    assert answer.trial.layout.sequence_parallel == 8 and answer.trial.ds_config["sequence_parallel_size"] == 8
    assert answer.seq_len > 6 * plain.seq_len
    assert not any("sequence parallel" in note for note in answer.notes())


def test_a_learned_position_table_caps_the_answer_and_one_below_the_step_is_said() -> None:
    """GPT-2's 1,024 learned rows cap the search (no scaling extends them) and are its next limit; a table shorter
    than the 256-token step answers nothing, saying so, not that memory ran out."""
    gpt2 = _work("gpt2")
    answer = longest_fit(gpt2)
    assert answer.seq_len == 1024 and answer.next_limit.memory == "positions"
    short = replace(gpt2, model=replace(gpt2.model, max_positions=128))
    with pytest.raises(NoLengthFits, match="learned 128 positions, fewer than the shortest length searched"):
        longest_fit(short)
