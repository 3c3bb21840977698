"""Tiny configs of every architecture the profile tests and the accuracy bench cover (pure data).

Small dimensions, same code paths as the published models: grouped-query heads, sliding windows, MoE experts,
dense-first layers, multi-head latent attention. Four layers, so the profile's two-layer extrapolation is exercised.
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
