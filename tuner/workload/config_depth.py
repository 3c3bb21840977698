"""A bound on how deep a config's model is in all (:func:`check_depth`), checked before anything is built: every
layer count it carries, in it and in its nested configs (``text_config``, ``vision_config``, an encoder's and a
decoder's), summed, at most :data:`MAX_TOTAL_LAYERS`.

Why the sum, and why this bound: describing a model (building it on ``meta``, tracing its activations under fake
tensors) costs Python work per layer whatever the widths. A tiny Mixtral (hidden 64) with 64 layers is described
in about 40 s on two shared cores, one with 512 layers did not finish in 200 s, and each layer count was within its
own bound (1,024: :mod:`tuner.workload.config_bounds`); an encoder and a decoder of 1,000 layers each passed every
bound. The deepest published models have about 160 layers (Llama-3.1-405B 126, PaLM 118); every transformers config
class's defaults have at most 128 in all. A layer count is a whole number under a name of the layer-count shape
(``num_hidden_layers``, ``decoder_layers``, ``n_layer``, ``depth``); lists (``kv_source_layers``, layer indices) and
thresholds (``max_window_layers``, ``first_k_dense_replace``) are not counts. Pure.

Example:
    >>> check_depth({"model_type": "bart", "encoder_layers": 12, "decoder_layers": 12})
    >>> check_depth({"model_type": "bart", "encoder_layers": 200, "decoder_layers": 200})
    Traceback (most recent call last):
    tuner.workload.errors.WorkloadError: model.encoder_layers: 400 layers in all (encoder_layers 200 + ...); at most 256
"""

from __future__ import annotations

import re
from typing import Any

from tuner.workload.errors import WorkloadError

MAX_TOTAL_LAYERS = 256
COUNT = re.compile(r"(^|_)(layers|n_layer|depth|blocks)$")
NOT_A_COUNT = re.compile(r"^(max|min|first|last|start|end)_|window|index|skip|every|interval|freq|step|stride")


def layer_counts(config: Any, path: str = "model") -> list[tuple[str, int]]:
    """Every layer count in ``config`` and its nested config objects, as ``(path, count)``."""
    if not isinstance(config, dict):
        return []
    found: list[tuple[str, int]] = []
    for key, value in config.items():
        if isinstance(value, dict):
            found += layer_counts(value, f"{path}.{key}")
        elif _is_count(key, value):
            found.append((f"{path}.{key}", value))
    return found


def _is_count(key: str, value: Any) -> bool:
    """A positive whole number under a layer-count name."""
    is_number = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return is_number and bool(COUNT.search(key)) and not NOT_A_COUNT.search(key)


def check_depth(config: Any) -> None:
    """Refuse a config whose layer counts sum past :data:`MAX_TOTAL_LAYERS`: a :class:`WorkloadError` naming the
    largest of them."""
    counts = layer_counts(config)
    total = sum(count for _, count in counts)
    if total <= MAX_TOTAL_LAYERS:
        return
    largest = max(counts, key=lambda item: item[1])[0]
    parts = " + ".join(f"{name.removeprefix('model.')} {count}" for name, count in counts)
    raise WorkloadError(largest, f"{total} layers in all ({parts}); at most {MAX_TOTAL_LAYERS}")


__all__ = ["MAX_TOTAL_LAYERS", "check_depth", "layer_counts"]
