"""Tiny configs of every architecture the profile tests and the accuracy and coverage benches cover (test helpers,
not part of the package).

:data:`TINY_CONFIGS` (pure data): small dimensions, same code paths as the published models: grouped-query heads,
sliding windows, MoE experts, dense-first layers, multi-head latent attention. Four layers, so the profile's
two-layer extrapolation is exercised. :func:`shrunk_config` makes one for any model type from its config class's
defaults (imports transformers when called).
"""

from __future__ import annotations

from typing import Any

COMMON: dict[str, Any] = {"vocab_size": 512, "max_position_embeddings": 256, "num_hidden_layers": 4}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2", "vocab_size": 512, "n_positions": 256, "n_embd": 64, "n_layer": 4, "n_head": 4},
    "llama": {
        **COMMON,
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
    },
    "mistral": {
        **COMMON,
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": 4096,
    },
    "qwen2": {
        **COMMON,
        "model_type": "qwen2",
        "hidden_size": 96,
        "intermediate_size": 256,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
    },
    "gemma2": {
        **COMMON,
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "sliding_window": 32,
        "query_pre_attn_scalar": 32,
        "pad_token_id": 0,
    },
    "phi3": {
        **COMMON,
        "model_type": "phi3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "pad_token_id": 0,
    },
    "falcon": {
        "model_type": "falcon",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "max_position_embeddings": 256,
    },
    "mixtral": {
        **COMMON,
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe": {
        **COMMON,
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 48,
        "shared_expert_intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [0],
    },
    "deepseek_v2": {
        **COMMON,
        "model_type": "deepseek_v2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_group": 1,
        "topk_group": 1,
    },
}


# A 2-layer LLaMA whose 4 attention and 2 key-value heads Ulysses can split 2 ways: the sequence-parallel runs' model
SP_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "depth")
HIDDEN = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "word_embed_proj_dim")
WIDTH = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "decoder_ffn_dim", "mlp_dim", "d_ff")
MOE_WIDTH = ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size")
HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
EXPERTS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts", "num_routed_experts")
PICKED = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "top_k", "moe_k")
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
HEAD_DIM = ("head_dim", "rotary_dim", "rope_dim", "kv_channels", "head_size", "d_head")  # parts of names
FIXED = {"kv_lora_rank": 32, "q_lora_rank": 32, "vocab_size": 512}
# the most each kind of dimension keeps (the name groups above do not overlap); layers: as asked
CAPS: dict[str, int] = {
    **dict.fromkeys(HIDDEN, 64),
    **dict.fromkeys(WIDTH, 128),
    **dict.fromkeys(MOE_WIDTH, 32),
    **dict.fromkeys(HEADS, 4),
    **dict.fromkeys(EXPERTS, 4),
    **dict.fromkeys(PICKED, 2),
    **dict.fromkeys(POSITIONS, 512),
    **FIXED,
}


def _shrunk(values: dict[str, Any], layers: int) -> dict[str, Any]:
    """One config dict (a nested text or vision config too) with its dimensions shrunk."""
    out = dict(values)
    old_layers = next((values[k] for k in LAYERS if isinstance(values.get(k), int)), None)
    heads = next((values[k] for k in HEADS if isinstance(values.get(k), int)), None)
    hidden = next((values[k] for k in HIDDEN if isinstance(values.get(k), int)), None)
    head_dim = values.get("head_dim") if isinstance(values.get("head_dim"), int) else None
    head_dim = head_dim or (hidden // heads if hidden and heads else 64)
    caps = {**CAPS, **dict.fromkeys(LAYERS, layers)}
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = _shrunk(value, 2)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key in caps:
            out[key] = min(value, caps[key])
        elif key in KV_HEADS:
            out[key] = 1 if value == 1 else (2 if heads and value < heads else min(value, 4))
        elif any(part in key for part in HEAD_DIM):  # head dimensions shrink together (rotary parts stay parts)
            out[key] = max(2, value * 16 // head_dim) if value * 16 % head_dim == 0 else min(value, 16)
        elif key.endswith("token_id") and value >= 512:
            out[key] = 511 - len([k for k in out if k.endswith("token_id")]) % 64
    if isinstance(values.get("n_group"), int) and isinstance(values.get("topk_group"), int):
        out["n_group"] = out["topk_group"] = 1
    if old_layers is not None:  # per-layer lists (and per-layer configs by index) follow the shorter model
        new_layers = next(out[k] for k in LAYERS if isinstance(values.get(k), int))
        if isinstance(values.get("per_layer_config"), dict):
            base = {key: value for key, value in values.items() if key != "per_layer_config"}
            out["per_layer_config"] = {
                k: {name: _shrunk({**base, **v}, layers)[name] for name in v}  # what the layer changes, shrunk
                for k, v in values["per_layer_config"].items()
                if int(k) < new_layers and isinstance(v, dict)
            }
        for key, value in values.items():
            if isinstance(value, list) and len(value) == old_layers and key != "architectures":
                out[key] = value[:new_layers]
    return out


def shrunk_config(model_type: str, layers: int = 6) -> dict[str, Any]:
    """A tiny ``config.json`` dict of ``model_type``: its config class's defaults, few layers (``layers``, 2 in
    nested vision or audio configs), hidden size 64, 4 heads, 4 experts, a 512-token vocabulary."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    values = CONFIG_MAPPING[model_type]().to_dict()
    for key in ("transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype"):
        values.pop(key, None)
    return _consistent({**_shrunk(values, layers), "model_type": model_type})


def _consistent(config: dict[str, Any]) -> dict[str, Any]:
    """The counts that must agree with the shrunk dimensions made to agree, as a user's small config would: a
    Mamba mixer's heads times head size equal to its inner width, layer counts of parts that sum to the layers,
    shared-KV layers fewer than the layers, layer indices the config class derives from the layer kinds
    (Kolibri-1.1's indexer and KV-source layers) derived again for the shrunk ones."""
    out = dict(config)
    hidden, layers = out.get("hidden_size"), out.get("num_hidden_layers")
    if not isinstance(hidden, int) or not isinstance(layers, int):
        return out
    mixers = [("mamba_n_heads", "mamba_d_head", "mamba_expand")]
    if "state_size" in out:  # Mamba-2's own names
        mixers.append(("num_heads", "head_dim", "expand"))
    for heads, head, expand in mixers:
        if all(isinstance(out.get(k), int) for k in (heads, head, expand)):
            out[head] = 16
            out[heads] = out[expand] * hidden // 16
    if isinstance(out.get("mamba_d_ssm"), int):
        out["mamba_d_ssm"] = out.get("mamba_expand", 2) * hidden
    for key in ("mamba_d_state", "state_size"):
        if isinstance(out.get(key), int):
            out[key] = min(out[key], 16)
    if isinstance(out.get("vocab_size_per_layer_input"), int):  # Gemma-3n's per-layer embeddings: 262,144 rows
        out["vocab_size_per_layer_input"] = min(out["vocab_size_per_layer_input"], out.get("vocab_size", 512))
    if "mamba_n_heads" in out and out.get("attn_layer_indices", 0) is None:  # hybrids hold attention layers
        out["attn_layer_indices"] = [1]
    kinds = out.get("layer_types")
    if isinstance(kinds, list) and kinds and set(kinds) == {"linear_attention"} and "mamba_n_heads" in out:
        out["layer_types"] = [*kinds[:1], "attention", *kinds[2:]]
    parts = ("n_input_layers", "n_recurrent_layers", "n_output_layers")
    if all(isinstance(out.get(k), int) for k in parts):
        out.update(dict(zip(parts, (layers // 3, layers - 2 * (layers // 3), layers // 3), strict=True)))
    for key in ("index_layers", "kv_source_layers"):  # None: derived from the shrunk layer_types by the class
        if isinstance(out.get(key), list):
            out[key] = None
    heads, kv_heads = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if isinstance(out.get("index_num_heads"), int) and isinstance(heads, int) and isinstance(kv_heads, int):
        out["index_num_heads"] = max(1, min(out["index_num_heads"], heads // kv_heads))  # per key head
    if isinstance(out.get("num_kv_shared_layers"), int):  # the shared layers' kinds among the layers before them
        kinds = out.get("layer_types") or []
        shared = min(out["num_kv_shared_layers"], layers // 3)
        while shared and not set(kinds[layers - shared :]) <= set(kinds[: layers - shared]):
            shared -= 1
        out["num_kv_shared_layers"] = shared
    return out


def decoder_only(model_type: str) -> bool:
    """Whether transformers' causal LM of ``model_type`` is a decoder-only model: not the decoder of an
    encoder-decoder (``is_encoder_decoder``), nor an encoder whose LM head needs ``is_decoder=True`` (BERT...)."""
    import inspect

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    try:
        if config_class().is_encoder_decoder:
            return False
    except Exception:  # defaults that do not validate: not an encoder-decoder config
        pass
    mapping: Any = transformers.AutoModelForCausalLM._model_mapping
    model_class = mapping[config_class]
    return "is_decoder" not in inspect.getsource(model_class.__init__)
