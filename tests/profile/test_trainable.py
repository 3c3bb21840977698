"""The model as trained: the adapter added by the real peft library and the freeze pattern, counted against peft's
own ``get_nb_trainable_parameters`` (the independent truth), and bad adapter configs refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from tuner.profile.hf import build  # noqa: E402
from tuner.profile.trainable import apply_trainable, trainable_counts  # noqa: E402
from tuner.workload import TrainableSpec, WorkloadError, preset_config  # noqa: E402

LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.05}


def built(device: str, preset: str = "tiny-llama") -> Any:
    with torch.device(device):
        return build(preset_config(preset), dtype=torch.bfloat16)


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize(
    "adapter",
    [
        LORA,
        {**LORA, "modules_to_save": ["lm_head"], "bias": "lora_only"},
        {**LORA, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"v_proj": 32}, "use_dora": True},
    ],
    ids=["lora", "modules_to_save", "patterns_dora"],
)
def test_trainable_count_is_peft_own(device: str, adapter: dict[str, Any]) -> None:
    model = apply_trainable(built(device), TrainableSpec.of(adapter))
    assert isinstance(model, peft.PeftModel)
    assert not model.peft_config["default"].inference_mode
    assert trainable_counts(model) == model.get_nb_trainable_parameters()
    assert all(p.device.type == device for p in model.parameters())


def test_tiny_llama_lora_counts_by_hand() -> None:
    # 4 layers × r·(in + out): q_proj 128→128, v_proj 128→64 (2 KV heads of 32), r = 8
    base = sum(p.numel() for p in built("meta").parameters())
    model = apply_trainable(built("meta"), TrainableSpec.of({"r": 8, "target_modules": ["q_proj", "v_proj"]}))
    lora = 4 * 8 * ((128 + 128) + (128 + 64))
    assert trainable_counts(model) == (lora, base + lora)


def test_real_peft_model_trains_only_adapters() -> None:
    model = apply_trainable(built("cpu"), TrainableSpec.of(LORA))
    ids = torch.randint(0, 1024, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        assert (param.grad is not None) == ("lora_" in name), name


def test_freeze_alone_and_with_peft() -> None:
    plain = built("meta")
    total = sum(p.numel() for p in plain.parameters())
    embed = plain.get_input_embeddings().weight.numel()
    assert apply_trainable(plain, TrainableSpec(freeze=r"embed_tokens")) is plain
    assert trainable_counts(plain) == (total - embed, total)
    model = apply_trainable(built("meta"), TrainableSpec.of({**LORA, "modules_to_save": ["lm_head"]}, r"lm_head"))
    trainable, _ = trainable_counts(model)
    assert trainable == trainable_counts(apply_trainable(built("meta"), TrainableSpec.of(LORA)))[0]


def test_full_fine_tuning_returns_the_model() -> None:
    model = built("meta")
    assert apply_trainable(model, TrainableSpec()) is model


@pytest.mark.parametrize(
    ("adapter", "freeze", "field"),
    [
        ({**LORA, "r": 0}, "", "peft.r: must be a positive integer"),
        ({**LORA, "r": True}, "", "peft.r: must be a positive integer"),
        ({**LORA, "target_modules": ["nope"]}, "", "peft.target_modules: .*not found in the model"),
        ({**LORA, "target_modules": ["q_proj", "v_prj"]}, "", "peft.target_modules: 'v_prj' not found in the model"),
        ({**LORA, "target_modules": "nope.*"}, "", "peft.target_modules: .*not found in the model"),
        ({**LORA, "target_modules": None}, "", "peft.target_modules"),
        ({**LORA, "peft_type": "IA3"}, "", "peft.peft_type: only LORA"),
        ({**LORA, "lora_rank": 8}, "", "peft.lora_rank: not a field"),
        ({**LORA, "lora_dropout": 1.5}, "", "peft.lora_dropout"),
        ({**LORA, "bias": "some"}, "", "peft.bias"),
        ({**LORA, "modules_to_save": ["nope"]}, "", "peft.modules_to_save: 'nope' not found"),
        ({**LORA, "rank_pattern": {"q_proj": -1}}, "", "peft.rank_pattern.q_proj"),
        ({**LORA, "task_type": "SEQ_CLS"}, "", "peft.task_type"),
        ({**LORA, "loftq_config": {"loftq_bits": 4}}, "", "peft.loftq_config"),
        (None, "no_such_parameter", "freeze: .*matches no parameter"),
        (None, ".", "freeze: .*leaves no parameter trainable"),
        (LORA, "lora_", "freeze: .*leaves no parameter trainable"),
    ],
)
def test_bad_trainable_specs_name_the_field(adapter: dict[str, Any] | None, freeze: str, field: str) -> None:
    with pytest.raises(WorkloadError, match=field) as raised:
        apply_trainable(built("meta"), TrainableSpec.of(adapter, freeze))
    assert "\n" not in str(raised.value)
    json.dumps(str(raised.value))


@pytest.mark.parametrize("adapters", ["", "zero3"])
def test_profile_of_the_model_as_trained(tmp_path: Any, adapters: str) -> None:
    """The peft model's parameter facts match peft's counts, and its traced activations the real peft model's
    saved bytes: adapters cast to bf16 as ZeRO 0-2 do, or as under ZeRO-3, kept fp32 with every Linear run by
    DeepSpeed's own ``zero3_linear_wrap`` (which ``zero.Init`` installs as ``F.linear``: it saves frozen
    projections' inputs too)."""
    from saved_bytes import saved_bytes

    from tuner.profile import ProfileCache, model_profile, params_profile

    config, cache = preset_config("tiny-llama"), ProfileCache(tmp_path)
    spec = TrainableSpec.of({**LORA, "modules_to_save": ["lm_head"]})
    base = params_profile(config, cache)
    profile = model_profile(config, 64, "bf16", None, (False,), cache, spec)
    peft_model = apply_trainable(built("meta"), spec)
    trainable, total = peft_model.get_nb_trainable_parameters()
    assert (profile.trainable_params, profile.n_params) == (trainable, total)
    assert profile.param_numels == tuple(p.numel() for p in peft_model.parameters())
    assert profile.trainable == tuple(p.requires_grad for p in peft_model.parameters())
    assert profile.trainable_elements_by_dtype == {"fp32": 14_336, "bf16": 1024 * 128}  # adapters, lm_head copy
    assert profile.frozen_elements_by_dtype == {"bf16": base.n_params}
    assert profile.largest_frozen_numel == profile.largest_trainable_numel == 1024 * 128
    assert base.trainable == () and params_profile(config, cache) == base  # the full model's entry is untouched
    torch.manual_seed(0)
    real_model = apply_trainable(build(config, dtype=torch.bfloat16), spec)  # real tensors, as trained
    if not adapters:  # DeepSpeed's engine casts every parameter at ZeRO 0-2
        real_model.to(torch.bfloat16)
    real_model.train()
    tokens = torch.randint(0, 1024, (2, 64))
    if adapters == "zero3":
        linear = pytest.importorskip("deepspeed.runtime.zero.linear")
        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(torch.nn.functional, "linear", linear.zero3_linear_wrap)
        try:
            real = saved_bytes(real_model, tokens)  # the independent instrument, over DeepSpeed's own linear
        finally:
            monkeypatch.undo()
        plain = profile.activation_bytes(64, "bf16", profile.attention, False, 2, "")
        assert plain is not None and real > plain[0]  # the frozen projections' inputs, beside fp32 adapters
    else:
        real = saved_bytes(real_model, tokens)  # the independent instrument
    assert profile.activation_bytes(64, "bf16", profile.attention, False, 2, adapters) == (real, 0)


@pytest.mark.parametrize(
    ("adapter", "freeze"),
    [
        ({**LORA, "target_modules": "(.|.)*z"}, ""),
        ({**LORA, "exclude_modules": "(.|.)*z"}, ""),
        ({**LORA, "rank_pattern": {"(.|.)*z": 4}, "alpha_pattern": {"(a|aa)*b": 4}}, ""),
        (None, "(.|.)*z"),
    ],
)
def test_hostile_patterns_end_at_once(adapter: dict | None, freeze: str) -> None:
    """Patterns peft would run with Python's backtracking re are resolved with RE2 first: the model is built (or the
    pattern refused, naming its field) in well under a second beyond building it."""
    import time

    model = built("meta")
    started = time.perf_counter()
    try:
        apply_trainable(model, TrainableSpec.of(adapter, freeze or None))
    except WorkloadError as error:
        assert error.field.split(".")[0] in ("peft", "freeze")
    assert time.perf_counter() - started < 5


def test_a_target_modules_regex_builds_the_model_peft_would() -> None:
    """A string target_modules, matched by RE2 and handed to peft as names, trains what the name list does."""
    by_regex = apply_trainable(built("meta"), TrainableSpec.of({**LORA, "target_modules": r".*\.(q_proj|v_proj)"}))
    by_names = apply_trainable(built("meta"), TrainableSpec.of(LORA))
    assert trainable_counts(by_regex) == trainable_counts(by_names)


def test_a_freeze_leaving_only_the_last_layer_trainable_is_estimated() -> None:
    """``--freeze`` over everything but the last decoder layer was refused ("leaves no parameter trainable"): the
    profile's shortened copy keeps the first layers only, and the check ran on the copy. The copy of a freeze is
    traced whole, so the activations are those of the layers as frozen: the last layer's backward saves, the frozen
    ones before it save nothing for it (measured: 8,744,340 B true peak per rank, estimate 8,938,756 B, +2.2 %)."""
    from typer.testing import CliRunner

    from tuner.cli import app

    args = [
        "estimate",
        "--model",
        "tiny-llama",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--seq-len",
        "64",
        "--micro-batch",
        "4",
    ]
    args += ["--json"]
    frozen = CliRunner().invoke(app, [*args, "--freeze", r"model\.(embed_tokens|norm|layers\.[0-2])|lm_head"])
    assert frozen.exit_code == 0, frozen.output
    last = sum(p.numel() for name, p in built("meta").named_parameters() if name.startswith("model.layers.3."))
    answer = json.loads(frozen.stdout)
    assert answer["trainable_params"] == last
    assert answer["per_gpu"]["activations"] > 0
    everything = CliRunner().invoke(app, [*args, "--freeze", r"model\.|lm_head"])
    assert everything.exit_code == 2 and "leaves no parameter trainable" in everything.stderr
