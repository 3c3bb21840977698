"""A user's ``config.json`` as transformers writes it, read back and described exactly: transformers 5's tagged
floats (``{"__float__": "Infinity"}``), transformers 4's bare ``Infinity``, and models whose construction or whose
other fields tie them to their full depth (the profile's small copy keeps its layers consistent with the model's).
Truth: the real model transformers builds from the same folder (``from_pretrained``), its parameters counted and the
bytes autograd saves in one training call measured on CPU (``tests/saved_bytes.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from saved_bytes import saved_bytes  # noqa: E402
from tiny_configs import shrunk_config  # noqa: E402

from tuner.profile import ProfileCache, model_profile  # noqa: E402
from tuner.profile.hf import hf_config, quiet  # noqa: E402
from tuner.workload import load_hf_config  # noqa: E402

SEQ, BATCH = 16, 2


@pytest.fixture
def cache(tmp_path: Path) -> ProfileCache:
    """An empty profile cache."""
    return ProfileCache(tmp_path / "profiles")


def saved_folder(tmp_path: Path, model_type: str, **values: object) -> Path:
    """The folder ``save_pretrained`` writes for a small config of ``model_type`` (``values`` replace fields)."""
    fields = {k: v for k, v in {**shrunk_config(model_type), **values}.items() if k != "model_type"}
    with quiet():
        transformers.AutoConfig.for_model(model_type, **fields).save_pretrained(tmp_path / model_type)
    return tmp_path / model_type


def truth(folder: Path) -> tuple[int, int]:
    """(parameters, bytes saved at SEQ, BATCH in fp32) of the model transformers builds from the folder."""
    torch.manual_seed(0)
    with quiet():
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
        model.train()
        tokens = torch.randint(0, 500, (BATCH, SEQ))
        return sum(p.numel() for p in model.parameters()), saved_bytes(model, tokens)


def described(folder: Path, cache: ProfileCache) -> tuple[int, int]:
    """(parameters, activation bytes) dstune gives for the folder's ``config.json``, read as the CLI reads it."""
    config, _ = load_hf_config(str(folder / "config.json"))
    profile = model_profile(config, SEQ, "fp32", None, (False,), cache)
    found = profile.activation_bytes(SEQ, "fp32", profile.attention, False, BATCH)
    assert found is not None
    return profile.n_params, found[0]


def test_transformers5_tagged_infinity_reads_back(tmp_path: Path, cache: ProfileCache) -> None:
    """Mamba-2's ``time_step_limit`` (0, inf) is written ``{"__float__": "Infinity"}``: read back as transformers
    reads it, and the model described exactly."""
    folder = saved_folder(tmp_path, "mamba2")
    assert {"__float__": "Infinity"} in json.loads((folder / "config.json").read_text())["time_step_limit"]
    config, _ = load_hf_config(str(folder))
    assert tuple(hf_config(config).time_step_limit) == (0.0, float("inf"))
    assert described(folder, cache) == truth(folder)


def test_bare_infinity_of_transformers4_reads_as_the_tag(tmp_path: Path) -> None:
    """A file transformers 4 wrote (bare ``Infinity``, which Python's json reads) is held as transformers 5 writes
    it: plain JSON any store keeps, the same value for transformers."""
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "mamba2", "time_step_limit": [0.0, Infinity], "x": {"y": -Infinity}}')
    config, _ = load_hf_config(str(path))
    assert config["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    assert config["x"] == {"y": {"__float__": "-Infinity"}}
    assert json.loads(json.dumps(config, allow_nan=False)) == config


@pytest.mark.parametrize("model_type", ["deepseek_v4", "hy_v4"])
def test_model_built_only_outside_fake_tensors_is_described(
    model_type: str, tmp_path: Path, cache: ProfileCache
) -> None:
    """DeepSeek-V4's and HY-V4's layers convert a module with ``.to()`` while constructed, which cannot swap a fake
    parameter: the copy is built on ``meta`` and given fake storage, not refused as if transformers could not build
    it."""
    folder = saved_folder(tmp_path, model_type)
    assert described(folder, cache) == truth(folder)


def test_short_copy_keeps_the_layers_of_the_full_model(tmp_path: Path, cache: ProfileCache) -> None:
    """ProphetNet's decoder refuses a rewritten ``num_hidden_layers`` (its depth is ``num_decoder_layers``): the
    copy is the whole model, its layers the full model's, described exactly."""
    folder = saved_folder(tmp_path, "prophetnet")
    assert described(folder, cache) == truth(folder)


def test_forward_that_needs_every_layer_is_traced_whole(tmp_path: Path, cache: ProfileCache) -> None:
    """Gemma-3n reshapes its per-layer embeddings by ``num_hidden_layers`` and shares the KV of earlier layers
    with its last: a copy of fewer layers cannot run, so every layer is traced, exactly."""
    folder = saved_folder(tmp_path, "gemma3n_text")
    config = json.loads((folder / "config.json").read_text())
    assert 0 < config["num_kv_shared_layers"] < config["num_hidden_layers"]
    assert described(folder, cache) == truth(folder)


@pytest.mark.parametrize("model_type", ["bamba", "granitemoehybrid"])
def test_hybrid_with_tagged_floats_is_described(model_type: str, tmp_path: Path, cache: ProfileCache) -> None:
    """Mamba-attention hybrids written by transformers 5 (their ``time_step_limit`` tagged) estimate exactly."""
    folder = saved_folder(tmp_path, model_type)
    assert "__float__" in (folder / "config.json").read_text()
    assert described(folder, cache) == truth(folder)


def test_text_stack_named_like_a_tower_is_found(tmp_path: Path, cache: ProfileCache) -> None:
    """CPM-Ant's decoder layers live in ``cpmant.encoder.layers`` (BERT-style naming, no other tower): found and
    described exactly, not refused for a missing layer list."""
    folder = saved_folder(tmp_path, "cpmant")
    assert described(folder, cache) == truth(folder)


@pytest.mark.parametrize("model_type", ["bart", "blenderbot-small"])
def test_causal_lm_of_an_encoder_decoder_family_is_described(
    model_type: str, tmp_path: Path, cache: ProfileCache
) -> None:
    """BART's and Blenderbot-small's causal LM is their decoder: its layers are ``decoder_layers`` long
    (``num_hidden_layers`` counts the encoder's: 12 and 8 here, the decoder's 6), found, not refused. Called without
    an attention mask, the decoder makes an all-ones one: SDPA runs ``is_causal`` and no layer saves a 4D mask, as
    on real tensors (on fake ones the ones are unreadable and a mask was built: +6 % at 64, +50 % at 512)."""
    folder = saved_folder(tmp_path, model_type)
    config = json.loads((folder / "config.json").read_text())
    assert config["encoder_layers"] != config["decoder_layers"]
    assert described(folder, cache) == truth(folder)


def test_composite_traced_with_the_attention_its_text_model_runs(tmp_path: Path, cache: ProfileCache) -> None:
    """GOT-OCR2's top level and vision tower resolve eager attention, its Qwen2 text model SDPA: the profile's
    attention is the text model's and the trace runs it, the vision tower keeping its own (traced with eager
    everywhere, each layer saved its attention weights: +17 % fp32, +39 % bf16 at 64)."""
    folder = saved_folder(tmp_path, "got_ocr2")
    config, _ = load_hf_config(str(folder / "config.json"))
    assert model_profile(config, SEQ, "fp32", None, (False,), cache).attention == "sdpa"
    assert described(folder, cache) == truth(folder)


@pytest.mark.parametrize("model_type", ["minimax", "lara_mini", "gemma2", "recurrent_gemma"])
def test_states_a_training_call_leaves_held_are_counted(model_type: str, tmp_path: Path, cache: ProfileCache) -> None:
    """Called with their config's ``use_cache=True``, as a training loop calls them, these models keep states
    alive until the output is dropped (at the loss, where activations peak) that autograd does not save: MiniMax's
    linear-attention states and unrepeated K/V in its cache, LARA-mini's, Gemma-2's K/V (eager attention saves the
    repeated heads), RecurrentGemma's recurrent and convolution states on its modules. Counted per layer (Gemma-2's
    cache makes every layer's entry up front: each is its own layer's), as the instrument counts them."""
    folder = saved_folder(tmp_path, model_type)
    assert described(folder, cache) == truth(folder)


def test_layers_counted_by_another_field_are_cut_by_it(tmp_path: Path, cache: ProfileCache) -> None:
    """LongCat-Flash's ``num_hidden_layers`` is twice ``num_layers`` (two attention sublayers per decoder layer) and
    setting it halves ``num_layers``: the small copy is cut through ``num_layers``. Before, the copy ran one layer
    where it meant two and the estimate was 82 % under. Its MoE sends some tokens to zero experts, chosen by the
    random weights' routing, so the truth and the trace differ by a few tokens' worth (0.05 % at 64 tokens)."""
    folder = saved_folder(tmp_path, "longcat_flash")
    (params, estimate), (real_params, real) = described(folder, cache), truth(folder)
    assert params == real_params and abs(estimate - real) <= 0.002 * real


def test_prophetnet_positions_stop_where_its_predicting_stream_does(tmp_path: Path) -> None:
    """ProphetNet's n-gram predicting streams index the position table one row past the main stream: with 512 rows
    from ``padding_idx + 1`` a sequence may hold 510 tokens, not 511. Truth: transformers' model trains at 510 and
    fails at 511."""
    from tuner.profile import params_profile
    from tuner.profile.describe import spec_from_profile

    folder = saved_folder(tmp_path, "prophetnet")
    config, _ = load_hf_config(str(folder / "config.json"))
    assert spec_from_profile(config, params_profile(config, ProfileCache(tmp_path / "p"))).position_limit == 510
    with quiet():
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
    for length in (510, 511):
        tokens = torch.randint(0, 500, (1, length))
        if length == 510:
            model(input_ids=tokens, labels=tokens).loss.backward()
        else:
            with pytest.raises(IndexError):
                model(input_ids=tokens, labels=tokens)


def test_weights_transformers_leaves_in_fp32_are_cast_as_deepspeed_casts_them(
    tmp_path: Path, cache: ProfileCache
) -> None:
    """XLNet makes its attention weights with ``torch.FloatTensor``: ``from_config(dtype=bfloat16)`` leaves them
    fp32 and the model fails in bf16, while DeepSpeed's engine casts the module (``module.bfloat16()``) and trains
    it. The profile's copy is cast the same way and estimated in bf16. Truth: transformers' model with every
    parameter cast by torch, its saved bytes measured in bf16."""
    folder = saved_folder(tmp_path, "xlnet")
    config, _ = load_hf_config(str(folder / "config.json"))
    profile = model_profile(config, SEQ, "bf16", None, (False,), cache)
    found = profile.activation_bytes(SEQ, "bf16", profile.attention, False, BATCH)
    torch.manual_seed(0)
    with quiet():
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
        model.train()
        assert {param.dtype for param in model.to(torch.bfloat16).parameters()} == {torch.bfloat16}
        real = saved_bytes(model, torch.randint(0, 500, (BATCH, SEQ)))
    assert found is not None and found[0] == real
