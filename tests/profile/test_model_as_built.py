"""The model the user trains: the attention transformers resolves for the config, and the call a training loop makes.

The truth is counted here, independently of :mod:`tuner.profile.trace`: the model built by
``AutoModelForCausalLM.from_config`` exactly as transformers builds it (no ``attn_implementation`` given), called as
a training loop calls it (train mode, ``model(input_ids=..., labels=...)``, the config's ``use_cache``), on real CPU
tensors; every storage autograd saves is counted once (parameters and buffers excluded) if still alive after the
forward pass. The estimate is the profile's activation bytes for the workload dstune builds from the same config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from saved_bytes import saved_bytes  # noqa: E402

from tuner.cli.app import app  # noqa: E402
from tuner.profile import ProfileCache, model_profile, params_profile  # noqa: E402
from tuner.requests import WorkloadRequest, to_workload  # noqa: E402
from tuner.space.dsconfig import hf_attn_implementation  # noqa: E402
from tuner.workload import WorkloadError  # noqa: E402

SMALL = {  # shrunk dimensions; every other field is the config class's default
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}
CONFIGS: dict[str, dict[str, Any]] = {
    # logit soft-capping: transformers builds it eager (its class refuses SDPA)
    "gemma2": {**SMALL, "model_type": "gemma2", "sliding_window": 32, "query_pre_attn_scalar": 16, "pad_token_id": 0},
    # attention sinks: eager too
    "gpt_oss": {
        **SMALL,
        "model_type": "gpt_oss",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 32,
        "pad_token_id": 0,
    },
    # the config's use_cache changes what a training call saves
    "gpt_neox": {
        **{k: v for k, v in SMALL.items() if k not in ("num_key_value_heads", "head_dim")},
        "model_type": "gpt_neox",
    },
    "qwen3_next": {
        **SMALL,
        "model_type": "qwen3_next",
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SEQ, BATCH = 64, 2


@pytest.fixture
def cache(tmp_path: Path) -> ProfileCache:
    """An empty profile cache."""
    return ProfileCache(tmp_path / "profiles")


def real_saved_bytes(config: dict[str, Any], precision: str) -> tuple[int, str]:
    """Bytes the model transformers builds saves in a training call (real CPU tensors), and its attention."""
    torch.manual_seed(0)
    values = {key: value for key, value in config.items() if key != "model_type"}
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(config["model_type"], **values), dtype=DTYPES[precision]
    )
    model.train()
    tokens = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    return saved_bytes(model, tokens), str(model.config._attn_implementation)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_estimate_matches_the_model_transformers_builds(architecture: str, precision: str, cache: ProfileCache) -> None:
    """Within 1 % (measured: equal in bf16, within 0.001 % in fp32) of the real model's saved bytes."""
    config = CONFIGS[architecture]
    real, implementation = real_saved_bytes(config, precision)
    profile = model_profile(config, SEQ, precision, None, (False,), cache)
    assert profile.attention == implementation  # the default is transformers' own
    estimate, _ = profile.activation_bytes(SEQ, precision, implementation, False, BATCH)
    assert estimate == pytest.approx(real, rel=0.01)


def test_default_attention_is_the_one_transformers_resolves(
    cache: ProfileCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSTUNE_PROFILE_CACHE", str(cache.folder))
    assert params_profile(CONFIGS["gemma2"], cache).attention == "eager"
    assert params_profile(CONFIGS["gpt_oss"], cache).attention == "eager"
    assert params_profile(CONFIGS["gpt_neox"], cache).attention == "sdpa"
    workload = to_workload(WorkloadRequest(config=CONFIGS["gemma2"], seq_len=16, device="cpu"))
    assert workload.train.attention == "eager" and workload.profile is not None
    assert workload.profile.activation(16, "bf16", "eager", False) is not None  # traced as built
    asked = to_workload(WorkloadRequest(config=CONFIGS["gpt_neox"], seq_len=16, device="cpu", attention="eager"))
    assert asked.train.attention == "eager"  # --attention still overrides, the trace follows
    assert asked.profile is not None and asked.profile.activation(16, "bf16", "eager", False) is not None
    assert hf_attn_implementation(workload.train.attention) == "eager"


def test_eager_estimate_grows_quadratically(cache: ProfileCache) -> None:
    """Eager attention keeps the score matrix: doubling the sequence more than doubles the per-layer bytes."""
    config = CONFIGS["gemma2"]
    short = model_profile(config, 32, "bf16", None, (False,), cache).activation(32, "bf16", "eager", False)
    long = model_profile(config, 64, "bf16", None, (False,), cache).activation(64, "bf16", "eager", False)
    assert short is not None and long is not None
    assert long.layers["L0"].per_sample > 2 * short.layers["L0"].per_sample


@pytest.mark.parametrize("attention", ["sdpa", "flash"])
def test_an_implementation_the_class_cannot_run_is_refused(attention: str, cache: ProfileCache) -> None:
    """No fallback changes the model's maths: Gemma-2 (soft-capping) is refused SDPA, in one line naming attention."""
    with pytest.raises(WorkloadError) as raised:
        model_profile(CONFIGS["gemma2"], 16, "bf16", attention, (False,), cache)
    assert raised.value.field == "attention" and "Gemma2ForCausalLM" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_cli_refuses_sdpa_for_gpt_oss_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUNE_PROFILE_CACHE", str(tmp_path / "profiles"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["gpt_oss"]))
    result = CliRunner().invoke(app, ["estimate", "--model", str(path), "--seq-len", "16", "--attention", "sdpa"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: attention:") and result.stderr.count("\n") == 1
    result = CliRunner().invoke(app, ["estimate", "--model", str(path), "--seq-len", "16", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["phases"]["forward"]["gpu"] > 0
