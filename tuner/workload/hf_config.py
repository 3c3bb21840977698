"""A Hugging Face ``config.json`` (or a built-in preset: the JSON files in ``presets/``) read into dstune's built-in
:class:`ModelSpec`, with the bounds an inline config is checked against before anything is built
(:func:`check_config_limits`).

Pure Python: gpt2, llama, mistral, qwen2 and gpt_neox (:data:`SUPPORTED_FAMILIES`) only; any other architecture is
described by :mod:`tuner.profile`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tuner.errors import InputError
from tuner.workload.config_bounds import pattern_limit
from tuner.workload.config_depth import check_depth
from tuner.workload.errors import WorkloadError
from tuner.workload.model import ModelSpec
from tuner.workload.plain_data import MAX_DEPTH, check_plain_data

PRESET_DIR = Path(__file__).parent / "presets"
SUPPORTED_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox")

# Upper bounds on an inline config's dimensions, checked before anything is built or counted (a clear error naming
# the field instead of minutes of work or a MemoryError). Each is several times the largest published model's: about
# 160 layers, hidden 25,600, MLP width 53,248, 256k vocabulary, 16,384 (tiny) experts, 10M positions.
MAX_LAYERS = 1024
CONFIG_LIMITS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), MAX_LAYERS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "head_dim", "kv_lora_rank", "q_lora_rank"), 2**17),
    **dict.fromkeys(
        ("intermediate_size", "n_inner", "ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size"),
        2**19,
    ),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "num_kv_heads"), 2**12),
    "vocab_size": 2**22,
    # experts: Doge's default is 16,384 tiny ones (transformers' DogeConfig)
    **dict.fromkeys(
        ("num_local_experts", "n_routed_experts", "num_experts", "n_shared_experts", "num_experts_per_tok"), 2**16
    ),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), 2**24),
}
MAX_CONFIG_DEPTH = 4  # nested configs (text_config...) deeper than this are refused


def check_config_limits(config: Any, path: str = "model", depth: int = 0) -> None:
    """Refuse an inline config whose dimensions (:data:`CONFIG_LIMITS`), in it or in a nested config object, are
    out of bounds (negative, or above the limit), or whose layers in all are too many
    (:func:`tuner.workload.config_depth.check_depth`): a :class:`WorkloadError` naming the field
    (``model.num_hidden_layers: must be at most 1024``).
    Pure and linear in the config's size: run before any model is described or built.

    Example:
        >>> check_config_limits({"model_type": "llama", "num_hidden_layers": 10**9})
        Traceback (most recent call last):
        tuner.workload.errors.WorkloadError: model.num_hidden_layers: must be at most 1024, got 1000000000
    """
    if not isinstance(config, dict):
        return
    if depth > MAX_CONFIG_DEPTH:
        raise WorkloadError(path, f"config objects nested deeper than {MAX_CONFIG_DEPTH} levels")
    for key, value in config.items():
        if isinstance(value, dict):
            check_config_limits(value, f"{path}.{key}", depth + 1)
            continue
        limit = CONFIG_LIMITS.get(key) or pattern_limit(key)  # the usual names, then every name by its shape
        if limit is None:
            continue
        for item in value if isinstance(value, list) else [value]:  # hidden_sizes: [...] per stage
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if not item <= limit:  # NaN fails too
                raise WorkloadError(f"{path}.{key}", f"must be at most {limit}, got {item!r}")
            if item < 0 and key in CONFIG_LIMITS:  # refused here, in pure Python, rather than by building the model
                raise WorkloadError(f"{path}.{key}", f"must not be negative, got {item!r}")
    if depth == 0:
        check_depth(config)  # the layers in all, nested configs' too: what describing the model costs


def _get(config: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def _require_int(config: dict[str, Any], *names: str, default: int | None = None) -> int:
    value = _get(config, *names, default=default)
    if value is None:
        raise WorkloadError(f"model.{names[0]}", "missing from the model config")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorkloadError(f"model.{names[0]}", f"must be a positive integer, got {value!r}")
    return value


def model_from_hf_config(config: dict[str, Any], name: str = "custom") -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dict.

    Supported ``model_type``: gpt2, llama, mistral, qwen2, gpt_neox. Defaults follow transformers' config classes.

    Example:
        >>> spec = model_from_hf_config({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
        ...                              "n_embd": 768, "n_layer": 12, "n_head": 12})
        >>> spec.n_params
        124439808
    """
    if not isinstance(config, dict):
        raise WorkloadError("model", "config.json must hold a JSON object")
    check_config_limits(config)
    family = config.get("model_type")
    if family not in SUPPORTED_FAMILIES:
        raise WorkloadError("model.model_type", f"unsupported {family!r}; supported: {', '.join(SUPPORTED_FAMILIES)}")
    if family == "gpt2":
        return _gpt2_spec(config, name)
    hidden = _require_int(config, "hidden_size")
    heads = _require_int(config, "num_attention_heads")
    common = dict(
        name=name,
        family=family,
        vocab_size=_require_int(config, "vocab_size"),
        hidden_size=hidden,
        num_layers=_require_int(config, "num_hidden_layers"),
        num_heads=heads,
        intermediate_size=_require_int(config, "intermediate_size"),
        max_positions=_require_int(config, "max_position_embeddings", default=2048),
    )
    if family == "gpt_neox":
        return _gpt_neox_spec(config, common, hidden, heads)
    return _gated_spec(config, common, family, hidden, heads)


def _gpt2_spec(config: dict[str, Any], name: str) -> ModelSpec:
    """GPT-2: learned positions, LayerNorm, a plain MLP, biases everywhere (transformers' ``GPT2Config`` defaults)."""
    hidden = _require_int(config, "n_embd", "hidden_size", default=768)
    heads = _require_int(config, "n_head", "num_attention_heads", default=12)
    return ModelSpec(
        name=name,
        family="gpt2",
        vocab_size=_require_int(config, "vocab_size", default=50257),
        hidden_size=hidden,
        num_layers=_require_int(config, "n_layer", "num_hidden_layers", default=12),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=_divide(hidden, heads, "model.n_head"),
        intermediate_size=_require_int(config, "n_inner", default=4 * hidden),
        max_positions=_require_int(config, "n_positions", "max_position_embeddings", default=1024),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        learned_positions=True,
        norm="layernorm",
        gated_mlp=False,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
    )


def _gpt_neox_spec(config: dict[str, Any], common: dict[str, Any], hidden: int, heads: int) -> ModelSpec:
    """GPT-NeoX: LayerNorm, a plain MLP, untied embeddings by default."""
    bias = bool(config.get("attention_bias", True))
    return ModelSpec(
        **common,
        num_kv_heads=heads,
        head_dim=_divide(hidden, heads, "model.num_attention_heads"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        norm="layernorm",
        gated_mlp=False,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=True,
    )


def _gated_spec(config: dict[str, Any], common: dict[str, Any], family: str, hidden: int, heads: int) -> ModelSpec:
    """Llama, Mistral and Qwen2: RMSNorm, a gated MLP, grouped-query attention; they differ in their biases."""
    kv_heads = _require_int(config, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise WorkloadError("model.num_key_value_heads", f"{kv_heads} does not divide {heads} attention heads")
    head_dim = _get(config, "head_dim") or _divide(hidden, heads, "model.num_attention_heads")
    if family == "llama":
        attention_bias = bool(config.get("attention_bias", False))
        qkv_bias, out_bias, mlp_bias = attention_bias, attention_bias, bool(config.get("mlp_bias", False))
    elif family == "qwen2":
        qkv_bias, out_bias, mlp_bias = True, False, False
    else:  # mistral
        qkv_bias = out_bias = mlp_bias = False
    return ModelSpec(
        **common,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        norm="rmsnorm",
        gated_mlp=True,
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=mlp_bias,
    )


def _divide(total: int, parts: int, field_name: str) -> int:
    if total % parts:
        raise WorkloadError(field_name, f"{parts} heads do not divide hidden size {total}")
    return total // parts


def preset_names() -> list[str]:
    """Names of the built-in model presets."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.json"))


def preset_config(name: str) -> dict[str, Any]:
    """The Hugging Face config dict behind a built-in preset."""
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise WorkloadError("model", f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return json.loads(path.read_text())


# how transformers 5 writes the floats JSON cannot hold (``configuration_utils._encode_special_floats``)
FLOAT_TAG = "__float__"


def tag_special_floats(value: Any, depth: int = 0) -> Any:
    """``value`` with each infinite or NaN float written as transformers 5 writes it in a ``config.json``
    (``{"__float__": "Infinity"}``): what transformers 4 wrote bare (``Infinity``, which Python's json reads) becomes
    plain JSON that any consumer can store, and reads back as transformers reads its own files.

    Example:
        >>> tag_special_floats({"time_step_limit": [0.0, float("inf")]})
        {'time_step_limit': [0.0, {'__float__': 'Infinity'}]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if depth > MAX_DEPTH:  # left as it is: check_plain_data refuses the nesting
        return value
    if isinstance(value, dict):
        return {key: tag_special_floats(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [tag_special_floats(item, depth + 1) for item in value]
    return value


def read_json_object(
    source: str | Path, field_name: str, default_file: str = "", tagged_floats: bool = False
) -> dict[str, Any]:
    """The JSON object in a file (or in ``default_file`` inside a folder); bad input names ``field_name``.
    ``tagged_floats``: infinite and NaN numbers (a ``config.json`` transformers 4 wrote) are read as transformers 5
    writes them (:func:`tag_special_floats`) instead of refused."""
    path = Path(source)
    if path.is_dir() and default_file:
        path = path / default_file
    if not path.is_file():
        raise WorkloadError(field_name, f"no such file: {path}")
    try:
        data = json.loads(path.read_text())
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        RecursionError,
    ) as error:  # RecursionError: nested too deep
        raise WorkloadError(field_name, f"cannot read {path} as JSON: {error}") from None
    if not isinstance(data, dict):
        raise WorkloadError(field_name, f"{path} must hold a JSON object")
    if tagged_floats:
        data = tag_special_floats(data)
    try:
        check_plain_data(data, field_name)  # NaN, Infinity, 1e400, control characters
    except InputError as error:
        raise WorkloadError(error.field, error.message) from None
    return data


def load_hf_config(source: str) -> tuple[dict[str, Any], str]:
    """The Hugging Face config dict and a display name for a preset name or a ``config.json`` path (or folder)."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists() or "/" in source:
        config = read_json_object(path, "model", tagged_floats=True)
        return config, config_label(config, path.parent.resolve().name)
    return preset_config(source), source


def config_label(config: dict[str, Any], folder: str) -> str:
    """A ``config.json`` model's name for tables and study names: its folder's name where that names the model type
    (a folder the user named: ``llama-3.1-8b``), else its ``_name_or_path`` (the last part: a folder such as the hub
    cache's ``snapshots/<hash>``, ``cfg`` or ``.`` says nothing of the model), else the model type.

    >>> config_label({"model_type": "llama"}, "llama-3.1-8b"), config_label({"model_type": "llama"}, "cfg")
    ('llama-3.1-8b', 'llama')
    >>> config_label({"model_type": "llama", "_name_or_path": "meta-llama/Llama-3.1-8B"}, "0e9e39f2")
    'Llama-3.1-8B'
    """
    model_type = str(config.get("model_type") or "model")
    if folder and model_type.lower() in folder.lower():
        return folder
    named = str(config.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    return named[:64] if named else model_type


def load_builtin_model(source: str) -> ModelSpec:
    """dstune's built-in model (gpt2, llama, mistral, qwen2, gpt_neox only: :data:`SUPPORTED_FAMILIES`) of a preset
    name or a path to a Hugging Face ``config.json`` (or a folder holding one). Pure Python, shapes and formula
    activations, no torch. Any other architecture, and the transformers model itself (exact parameters, traced
    activations): :func:`tuner.profile.load_model`, the one public way to get a model from a preset or a path."""
    config, name = load_hf_config(source)
    return model_from_hf_config(config, name=name)
