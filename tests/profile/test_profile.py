"""Model profiles: exact parameters on meta, traced activations against the real model's saved bytes, the cache,
bad input, and the estimator consuming a profile without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from real_saved_bytes import measured_saved_bytes  # noqa: E402
from tiny_configs import TINY_CONFIGS, shrunk_config  # noqa: E402

from tuner.cli.app import app  # noqa: E402
from tuner.estimator import estimate  # noqa: E402
from tuner.profile import ModelProfile, ProfileCache, model_profile, params_profile, with_profile  # noqa: E402
from tuner.profile.cache import activation_key  # noqa: E402
from tuner.workload import (  # noqa: E402
    ClusterSpec,
    TrainSpec,
    TrialConfig,
    Workload,
    WorkloadError,
    preset_config,
)

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = {  # parameter counts of the published models
    "mixtral-8x7b": 46_702_792_704,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "llama-3.1-70b": 70_553_706_496,
    "qwen2.5-7b": 7_615_616_512,
    "deepseek-v2-lite": 15_706_484_224,
    "llama-2-7b": 6_738_415_616,
}


@pytest.fixture
def cache(tmp_path: Path) -> ProfileCache:
    """An empty profile cache."""
    return ProfileCache(tmp_path / "profiles")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_are_the_published_ones(name: str, cache: ProfileCache) -> None:
    assert params_profile(preset_config(name), cache).n_params == PUBLISHED[name]


def test_largest_parameter_is_the_fused_experts_tensor(cache: ProfileCache) -> None:
    mixtral = params_profile(preset_config("mixtral-8x7b"), cache)
    assert mixtral.largest_param_numel == 939_524_096 == 8 * 2 * 14336 * 4096
    assert mixtral.largest_param_name.endswith("experts.gate_up_proj")
    deepseek = params_profile(preset_config("deepseek-v2-lite"), cache)
    assert deepseek.layer_counts == {"L0": 1, "L1": 26}  # one dense layer, then MoE layers
    assert deepseek.param_elements_by_dtype["fp32"] > 0  # kept in fp32 when the model is built in bf16


DEEPSEEK_V3 = {  # published architecture values of DeepSeek-V3 (671B)
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
}


def test_deepseek_v3_without_weights(cache: ProfileCache) -> None:
    """671B parameters counted on meta; ZeRO-3 gathers one fused experts tensor of 7.5 billion elements whole."""
    profile = params_profile(DEEPSEEK_V3, cache)
    assert profile.n_params == 671_026_404_352
    assert profile.largest_param_numel == 256 * 2 * 2048 * 7168 == 7_516_192_768
    assert profile.layer_counts == {"L0": 3, "L3": 58}


def test_tied_weights_count_once(cache: ProfileCache) -> None:
    gemma = params_profile(preset_config("gemma-2-9b"), cache)
    assert sum(gemma.param_numels) == gemma.n_params == PUBLISHED["gemma-2-9b"]
    assert gemma.layer_counts == {"L0": 21, "L1": 21}  # sliding and global attention layers alternate


# Every architecture as a user builds it (bf16, transformers' attention); the other two settings on the architectures
# whose code paths differ most (softcapped eager, experts, latent attention, fused QKV, parallel blocks): each case
# costs seconds, and bench/coverage.py checks every type transformers ships.
SETTINGS = {
    "bf16-default": ("bf16", None, False, 3),
    "fp32-eager-ckpt": ("fp32", "eager", True, 2),
    "bf16-eager-mb1": ("bf16", "eager", False, 1),
}
ACTIVATION_CASES = [(name, "bf16-default") for name in sorted(TINY_CONFIGS)] + [
    *((name, "fp32-eager-ckpt") for name in ("gemma2", "mixtral", "deepseek_v2", "gpt2")),
    *((name, "bf16-eager-mb1") for name in ("llama", "qwen2_moe", "falcon", "phi3")),
]


@pytest.mark.parametrize(("architecture", "setting"), ACTIVATION_CASES, ids=["-".join(c) for c in ACTIVATION_CASES])
def test_traced_activations_match_the_real_model(architecture: str, setting: str, cache: ProfileCache) -> None:
    """A 4-layer model on real CPU tensors saves what the fake-traced profile (2 layers per kind) predicts (default
    attention: the one transformers resolves)."""
    precision, attention, checkpointing, batch = SETTINGS[setting]
    config = TINY_CONFIGS[architecture]
    profile = model_profile(config, 40, precision, attention, (checkpointing,), cache)
    predicted, _ = profile.activation_bytes(40, precision, attention or profile.attention, checkpointing, batch)
    real = measured_saved_bytes(config, batch, 40, precision, attention, checkpointing)
    assert predicted == pytest.approx(real, rel=0.01)  # measured: within 0.001 % (bench/results)


def test_profile_is_linear_in_micro_batch_and_keyed_by_sequence_length(cache: ProfileCache) -> None:
    config = TINY_CONFIGS["llama"]
    profile = model_profile(config, 32, "bf16", "sdpa", (False,), cache)
    at = [profile.activation_bytes(32, "bf16", "sdpa", False, b)[0] for b in (2, 4, 6)]
    assert at[2] - at[1] == at[1] - at[0] > 0
    assert profile.activation_bytes(64, "bf16", "sdpa", False, 1) is None  # another length is another trace
    assert profile.activation_bytes(32, "bf16", "sdpa", True, 1) is None


def test_checkpointing_keeps_layer_inputs_and_recomputes_one_layer(cache: ProfileCache) -> None:
    config = TINY_CONFIGS["mixtral"]
    profile = model_profile(config, 32, "bf16", "sdpa", (False, True), cache)
    plain, no_recompute = profile.activation_bytes(32, "bf16", "sdpa", False, 2)
    checkpointed, recompute = profile.activation_bytes(32, "bf16", "sdpa", True, 2)
    assert no_recompute == 0 and checkpointed < plain
    per_layer = profile.activation(32, "bf16", "sdpa", False).layers["L0"].at(2)
    assert recompute == per_layer


def test_cache_hit_miss_and_key(cache: ProfileCache) -> None:
    config = TINY_CONFIGS["qwen2"]
    first = model_profile(config, 16, "bf16", "sdpa", (False,), cache)
    files = sorted(cache.folder.iterdir())
    assert [path.name.split("-")[0] for path in files] == ["activations", "params"]
    stamps = [path.stat().st_mtime_ns for path in files]
    again = model_profile(config, 16, "bf16", "sdpa", (False,), ProfileCache(cache.folder))
    assert again == first and [path.stat().st_mtime_ns for path in files] == stamps  # read, not traced again
    assert ModelProfile.from_dict(json.loads(json.dumps(first.to_dict()))) == first
    base = activation_key(config, "5.24.0", 16, "bf16", "sdpa", "default", False)
    variants = [
        activation_key(config, "5.25.0", 16, "bf16", "sdpa", "default", False),
        activation_key(config, "5.24.0", 32, "bf16", "sdpa", "default", False),
        activation_key(config, "5.24.0", 16, "fp32", "sdpa", "default", False),
        activation_key(config, "5.24.0", 16, "bf16", "eager", "default", False),
        activation_key(config, "5.24.0", 16, "bf16", "sdpa", "batched_mm", False),
        activation_key(config, "5.24.0", 16, "bf16", "sdpa", "default", True),
        activation_key({**config, "hidden_size": 48}, "5.24.0", 16, "bf16", "sdpa", "default", False),
    ]
    assert len({base, *variants}) == 8
    files[0].write_text("{not json")
    assert cache.get_activation(files[0].name.removeprefix("activations-").removesuffix(".json")) is None
    assert not list(cache.folder.glob(".*.tmp"))  # atomic writes leave no temporaries


BAD_CONFIGS = [
    pytest.param({"model_type": "no-such-model"}, "model.model_type", "unknown model_type", id="unknown-type"),
    pytest.param({"model_type": "vit"}, "model.model_type", "no causal language model", id="not-causal"),
    pytest.param(
        {**TINY_CONFIGS["llama"], "auto_map": {"AutoConfig": "x.Config"}},
        "model.auto_map",
        "trust_remote_code",
        id="remote-code",
    ),
    pytest.param(
        {**TINY_CONFIGS["llama"], "num_attention_heads": 5}, "model.hidden_size", "rejects", id="rejected-config"
    ),
    pytest.param(
        # reads values (fake tensors cannot run it), too large a copy for a trace on real tensors
        {**shrunk_config("jetmoe"), "vocab_size": 8_000_000},
        "model.model_type",
        "fake tensors",
        id="untraceable",
    ),
]


@pytest.mark.parametrize(("config", "field", "reason"), BAD_CONFIGS)
def test_bad_configs_name_the_field_and_cache_nothing(
    config: dict, field: str, reason: str, cache: ProfileCache
) -> None:
    with pytest.raises(WorkloadError) as raised:
        model_profile(config, 16, "bf16", None, (False,), cache)
    assert raised.value.field == field and reason in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not list(cache.folder.glob("activations-*"))


def test_cli_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_CONFIGS["llama"], "auto_map": {"AutoModel": "x.Model"}}))
    result = CliRunner().invoke(app, ["estimate", "--model", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: model.auto_map:") and result.stderr.count("\n") == 1


def test_estimate_uses_the_traced_activations(cache: ProfileCache) -> None:
    from tuner.profile import model_from_config

    config = TINY_CONFIGS["gemma2"]
    model = model_from_config(config, "tiny-gemma2", cache=cache)
    assert model.architecture == "Gemma2ForCausalLM" and model.n_params == params_profile(config, cache).n_params
    workload = with_profile(
        Workload(model, ClusterSpec(device="cpu"), TrainSpec(seq_len=24, attention="eager")), cache=cache
    )
    est = estimate(workload, {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}})
    assert est.activations_source == "trace" and est.to_dict()["architecture"] == "Gemma2ForCausalLM"
    assert est.phases["forward"].gpu["activations"] == measured_saved_bytes(config, 2, 24, "bf16", "eager", False)


def test_estimator_on_a_cached_profile_imports_no_torch(tmp_path: Path) -> None:
    """``dstune estimate`` on a cached model: the estimator and the cache read stay pure Python."""
    env = {**os.environ, "DSTUNE_PROFILE_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    command = ["estimate", "--model", "phi-3-mini", "--seq-len", "64", "--json"]
    run = [sys.executable, "-c", "import sys; from tuner.cli import app; sys.argv[1:] = sys.argv[1:]; app()"]
    first = subprocess.run([*run, *command], env=env, capture_output=True, text=True, check=True)
    probe = (
        "import sys, json; from typer.testing import CliRunner; from tuner.cli import app; "
        f"out = CliRunner().invoke(app, {command!r}).stdout; "
        "print(json.dumps({'torch': 'torch' in sys.modules, 'out': json.loads(out)}))"
    )
    second = json.loads(
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    )
    assert second["torch"] is False
    assert second["out"] == json.loads(first.stdout)
    assert second["out"]["activations_source"] == "trace"


def test_service_answers_pending_then_from_the_cache(cache: ProfileCache) -> None:
    """A new model is profiled in a worker process; the request that cannot wait gets ProfilePending."""
    from tuner.profile.service import ProfilePending, ProfileService

    config = TINY_CONFIGS["phi3"]
    service = ProfileService(cache, wait_s=0.0)
    try:
        with pytest.raises(ProfilePending):
            service.profile(config, 24, ("bf16",), "sdpa")
        service.wait_s = 120.0
        profile = service.profile(config, 24, ("bf16",), "sdpa")  # joins the work in flight
        assert profile.activation_bytes(24, "bf16", "sdpa", True, 2) is not None
        service.wait_s = 0.0
        assert service.profile(config, 24, ("bf16",), "sdpa") == profile  # cached now: no wait
        service.wait_s = 120.0
        with pytest.raises(WorkloadError) as raised:
            service.profile({**TINY_CONFIGS["llama"], "num_attention_heads": 5}, 24, ("bf16",), "sdpa")
        assert raised.value.field == "model.hidden_size"
    finally:
        service.close()


def test_api_estimates_any_architecture_and_refuses_custom_code(
    tmp_path: Path, cache: ProfileCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from tuner.api import create_app

    monkeypatch.setenv("DSTUNE_PROFILE_CACHE", str(cache.folder))
    config = TINY_CONFIGS["deepseek_v2"]
    model_profile(config, 32, "bf16", "sdpa", (False, True), cache)  # computed earlier (a worker, another request)
    with TestClient(create_app(f"sqlite:///{tmp_path / 'api.db'}", "token")) as client:
        workload = {"config": config, "seq_len": 32, "micro_batch": 16, "device": "cpu", "gpu_memory": "1GiB"}
        answer = client.post("/v1/estimate", json={"workload": workload})
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["architecture"] == "DeepseekV2ForCausalLM" and data["activations_source"] == "trace"
        assert data["peak_phase"] == "forward"
        assert data["per_gpu"]["activations"] == measured_saved_bytes(config, 16, 32, "bf16", "sdpa", False)
        bad = {**workload, "config": {**config, "auto_map": {"AutoConfig": "evil.Config"}}}
        refused = client.post("/v1/estimate", json={"workload": bad})
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["loc"] == ["body", "workload", "config", "auto_map"]


@pytest.mark.deepspeed
def test_measured_run_trains_the_transformers_model_the_profile_traced(cache: ProfileCache) -> None:
    """A study's measured run (``run_measurement``, no model_impl given) trains the transformers model its workload
    names: the activations real DeepSpeed saves are the profile's, to the byte."""
    pytest.importorskip("deepspeed")
    from tuner.measure.options import MeasureOptions
    from tuner.measure.run import run_measurement
    from tuner.profile import model_from_config

    config = TINY_CONFIGS["mixtral"]
    model = model_from_config(config, "tiny-mixtral", cache=cache)
    train = TrainSpec(seq_len=32, precision="bf16")
    workload = with_profile(Workload(model, ClusterSpec(device="cpu"), train), cache=cache)
    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"torch_adam": True}},
    }
    run = run_measurement(
        workload, TrialConfig(ds_config), MeasureOptions("local", warmup=2, steps=1, timeout=300)
    )  # probed on the 2nd warm-up step
    assert run.status == "ok", run.error
    est = estimate(workload, ds_config)
    assert run.ranks[0].activation_bytes == est.phases["forward"].gpu["activations"]


def test_which_embeddings_are_tied_and_which_experts_are_modules(tmp_path: Path) -> None:
    """Read from the built model: GPT-2 ties its LM head to the embedding, this LLaMA does not; transformers 5 fuses
    Mixtral's experts into one module (stacked parameters), where experts as modules of their own (switch
    transformers' ``expert_0``...) run only for the tokens routed to them."""
    from tuner.profile.model_parts import expert_modules

    cache = ProfileCache(tmp_path)
    gpt2 = params_profile({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100}, cache)
    llama = params_profile({**preset_config("tiny-llama"), "tie_word_embeddings": False}, cache)
    mixtral = params_profile(
        {
            "model_type": "mixtral",
            "vocab_size": 100,
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
        },
        cache,
    )
    assert (gpt2.tied_embeddings, llama.tied_embeddings, mixtral.tied_embeddings) == (True, False, False)
    assert not gpt2.expert_modules and not mixtral.expert_modules

    class Experts(torch.nn.Module):
        def __init__(self, count: int) -> None:
            super().__init__()
            for index in range(count):
                self.add_module(f"expert_{index}", torch.nn.Linear(4, 4))

    class Block(torch.nn.Module):
        def __init__(self, count: int) -> None:
            super().__init__()
            self.experts = Experts(count)

    assert expert_modules(Block(4)) and not expert_modules(Block(1))
    assert ModelProfile.from_dict(mixtral.to_dict()) == mixtral


@pytest.mark.parametrize(
    "model_type",
    [
        "gpt2",
        "opt",
        "roberta",
        "blenderbot",
        "bart",
        "ctrl",
        "whisper",
        "llama",
        "gpt_neox",
        "bloom",
        "xglm",
        "gemma3n_text",
    ],
)
def test_a_learned_position_table_limits_the_sequence(model_type: str) -> None:
    """GPT-2's ``wpe`` and Blenderbot's table hold ``max_position_embeddings`` positions from 0, OPT's and BART's
    start at their offset (2 rows more), the RoBERTa family's at ``padding_idx + 1`` (2 fewer: 510 of 512); rotary,
    ALiBi and XGLM's growing sinusoidal table compute theirs, so a longer sequence still runs; CTRL's fixed sinusoidal
    buffer and Whisper's ``max_target_positions`` table limit it; Gemma-3n's per-layer token table of as many rows in
    a small config does not. Truth: the model transformers builds runs at the limit and fails one token past it."""
    from tiny_configs import shrunk_config

    from tuner.profile.describe import spec_from_profile

    config = shrunk_config(model_type, layers=2)
    limit = spec_from_profile(config, params_profile(config)).position_limit
    positions = config.get("n_positions") or config.get("max_position_embeddings") or config.get("max_target_positions")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()

    def runs(length: int) -> bool:
        ids = torch.full((1, length), 5)
        try:
            with torch.no_grad():
                model(input_ids=ids)
        except (IndexError, RuntimeError):
            return False
        return True

    if limit:
        assert positions - 2 <= limit <= positions and runs(limit) and not runs(limit + 1)
    else:
        assert runs((positions or 512) + 1)  # BLOOM (ALiBi) has no positions in its config
