"""Bounds on a config's dimensions by the shape of their names (:func:`pattern_limit`), for every name transformers
uses, not a list of some: ``decoder_layers`` and ``encoder_layers`` are layer counts as ``num_hidden_layers`` is,
``decoder_ffn_dim``, ``v_head_dim``, ``state_size`` and ``d_ff`` widths, ``expand`` a factor, ``n_groups`` and
``decoder_attention_heads`` head counts. :data:`tuner.workload.hf_config.CONFIG_LIMITS` names the usual ones with
tighter bounds; a name it lacks falls to the first rule here its words match. Pure.

Each bound is far above any published model's (layers 1,024, widths 2**19, positions 2**24) and far below what
would take minutes or gigabytes to build or count. A name matched by its shape only may be negative (transformers'
``vision_feature_layer: -1`` is an index, ``chunk_size: -1`` a sentinel); the names of ``CONFIG_LIMITS`` may not.

Example:
    >>> [pattern_limit(name) for name in ("decoder_layers", "v_head_dim", "state_size", "expand", "rope_theta")]
    [1024, 524288, 524288, 65536, None]
"""

from __future__ import annotations

import re

MAX_LAYERS = 1024
RULES: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"(^|_)(layers|n_layer|depth|blocks)$"), MAX_LAYERS),  # decoder_layers, num_decoder_layers
    (re.compile(r"(^|_)experts?(_|$)"), 2**16),  # num_experts, n_routed_experts, expert_interval
    (re.compile(r"(^|_)(heads?|n_head|groups?)$"), 2**12),  # decoder_attention_heads, n_groups
    (re.compile(r"vocab"), 2**26),  # vocab_size itself: 2**22 (CONFIG_LIMITS); hashed n-gram tables are larger
    (re.compile(r"position|(^|_)n_ctx$|context|length|window|seq_len"), 2**24),  # sliding_window, max_length
    (re.compile(r"(^|_)(expand|factor|ratio|multiplier|mult)$"), 2**16),  # Mamba's expand, mlp_ratio, RoPE's factor
    # widths: hidden_size, decoder_ffn_dim, v_head_dim, qk_rope_head_dim, state_size, d_state, d_ff, d_kv, n_inner,
    # time_step_rank, conv_kernel, num_channels
    (re.compile(r"dim|(^|_)d_|rank|width|inner|state|channels|kernel|embd|ffn|hidden"), 2**19),
    (re.compile(r"size"), 2**21),  # any other size: image_size, chunk sizes
    (re.compile(r"^(num|n)_"), 2**20),  # any other count
)


def pattern_limit(name: str) -> int | None:
    """The bound of a config key by its name's shape (None: not a dimension, e.g. ``rope_theta``, ``*_token_id``)."""
    if name.endswith(("_id", "_ids", "_index", "_eps", "theta")):
        return None
    for pattern, limit in RULES:
        if pattern.search(name):
            return limit
    return None


__all__ = ["MAX_LAYERS", "RULES", "pattern_limit"]
