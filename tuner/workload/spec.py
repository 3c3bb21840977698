"""What is being trained: the model, the cluster, the sequence length, precision, attention and optimizer, and which
parameters train. How it is trained (micro-batch, accumulation, ZeRO, activation checkpointing: what the search
decides) is a :class:`tuner.workload.TrialConfig`, not part of a workload.

Pure Python: no torch, no transformers. A :class:`ModelSpec` comes from a Hugging Face ``config.json``, a built-in
preset (the JSON files in ``tuner/presets``), or a bare parameter count. For gpt2, llama, mistral, qwen2 and gpt_neox
its parameter count is computed here and equals what transformers instantiates, to the parameter
(``tests/test_workload.py``); any other causal LM transformers ships is described by :mod:`tuner.profile`, which
counts the parameters on the meta device and fills :attr:`ModelSpec.numels`. A :class:`Workload` may carry that
model profile (traced activations) for the estimator; the profile never enters fingerprints or stored dicts.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tuner.workload.model_profile import ModelProfile

from tuner.errors import InputError
from tuner.workload.patterns import compile_pattern
from tuner.workload.plain_data import check_plain_data
from tuner.workload.quantization import NEEDS_CUDA, QuantSpec

PRESET_DIR = Path(__file__).parent / "presets"
SUPPORTED_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gpt_neox")
Precision = Literal["fp32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
ATTENTION_KINDS: tuple[str, ...] = ("sdpa", "flash", "eager")
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw")
IMPLEMENTATIONS: tuple[str, ...] = ("builtin", "transformers")
# Fields added after workloads were first stored: left out of dicts (and fingerprints) while at their defaults.
OPTIONAL_MODEL_FIELDS = {"architecture": "", "implementation": "builtin", "hf_config": "", "numels": ()}


class WorkloadError(InputError):
    """Bad workload input; ``field`` names the offending field for error messages."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, described by the shapes that decide its memory.

    ``family == "params"`` is a bare parameter count: model states can be estimated, activations cannot.
    ``implementation``: the model measured runs train, dstune's built-in one or the transformers one built from
    ``hf_config`` (its canonical JSON); ``numels``: the parameters' element counts when counted by transformers
    (any ``model_type``), else derived from the shapes; ``architecture``: transformers' class name.
    """

    name: str
    family: str
    vocab_size: int = 0
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    max_positions: int = 0
    tie_embeddings: bool = True
    learned_positions: bool = False
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    gated_mlp: bool = True
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    bare_params: int | None = None
    architecture: str = ""
    implementation: str = "builtin"
    hf_config: str = ""
    numels: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.numels, tuple):  # JSON gives a list
            object.__setattr__(self, "numels", tuple(self.numels))
        if self.implementation not in IMPLEMENTATIONS:
            raise WorkloadError("model-impl", f"must be builtin or transformers, got {self.implementation!r}")

    @property
    def is_bare(self) -> bool:
        """True when only the parameter count is known (no shapes, no activations)."""
        return self.bare_params is not None

    def _layer_numels(self) -> tuple[list[int], list[int], list[int]]:
        """One block's parameter sizes, and those before and after the blocks, in the built-in model's order."""
        h = self.hidden_size
        q_out, kv_out, ffn = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.intermediate_size,
        )
        norm = [h, h] if self.norm == "layernorm" else [h]  # weight (+ bias)
        layer: list[int] = list(norm)
        if self.family in ("gpt2", "gpt_neox") and q_out == kv_out:
            layer += [h * 3 * q_out] + ([3 * q_out] if self.qkv_bias else [])  # fused qkv
        else:
            for out in (q_out, kv_out, kv_out):
                layer += [h * out] + ([out] if self.qkv_bias else [])
        layer += [q_out * h] + ([h] if self.out_bias else [])
        layer += norm
        for _ in range(2 if self.gated_mlp else 1):  # up (and gate) projections
            layer += [h * ffn] + ([ffn] if self.mlp_bias else [])
        layer += [ffn * h] + ([h] if self.mlp_bias else [])
        head = [self.vocab_size * h] + ([self.max_positions * h] if self.learned_positions else [])
        tail = norm + ([] if self.tie_embeddings else [self.vocab_size * h])
        return head, layer, tail

    @cached_property
    def param_numels(self) -> tuple[int, ...]:
        """Element count of every parameter tensor, in the built-in model's order (tied embeddings once).

        A bare parameter count is one tensor of that size (shapes unknown). Materialised per layer, so only the
        estimator's ZeRO partitions ask for it (model order decides which parameters straddle a partition); the
        counts below (:attr:`param_shapes`, :attr:`n_params`, :attr:`largest_param`) are arithmetic per layer kind.
        """
        if self.bare_params is not None:
            return (self.bare_params,)
        if self.numels:
            return self.numels
        head, layer, tail = self._layer_numels()
        return tuple(head + layer * self.num_layers + tail)

    @cached_property
    def param_shapes(self) -> tuple[tuple[int, int], ...]:
        """Parameter tensors grouped as ``(numel, how many tensors of that size)``, in order of first appearance.

        Counted per layer kind (one block's sizes times ``num_layers``): no per-layer list is built.
        """
        counts: dict[int, int] = {}
        if self.bare_params is not None or self.numels:
            for numel in self.param_numels:
                counts[numel] = counts.get(numel, 0) + 1
            return tuple(counts.items())
        head, layer, tail = self._layer_numels()
        for numels, times in ((head, 1), (layer, self.num_layers), (tail, 1)):
            for numel in numels:
                counts[numel] = counts.get(numel, 0) + times
        return tuple(counts.items())

    @cached_property
    def n_params(self) -> int:
        """Total trainable parameters (tied embeddings counted once)."""
        return sum(numel * count for numel, count in self.param_shapes)

    @cached_property
    def largest_param(self) -> int:
        """Elements of the largest single parameter tensor."""
        return max(numel for numel, _ in self.param_shapes)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON and fingerprints (fields added later are left out at their defaults)."""
        data = asdict(self)
        for name, default in OPTIONAL_MODEL_FIELDS.items():
            if data[name] == default:
                del data[name]
        if "numels" in data:
            data["numels"] = list(data["numels"])
        return data


@dataclass(frozen=True)
class ClusterSpec:
    """Where it runs: ``nodes`` × ``gpus_per_node`` data-parallel ranks, memory per GPU and per node's CPU."""

    gpus_per_node: int = 1
    nodes: int = 1
    gpu_memory: int = 80 * 2**30
    cpu_memory: int = 1024 * 2**30
    device: Literal["cuda", "cpu"] = "cuda"

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes", "gpu_memory", "cpu_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise WorkloadError(name.replace("_", "-"), f"must be a positive integer, got {value!r}")
        if self.device not in ("cuda", "cpu"):
            raise WorkloadError("device", f"must be cuda or cpu, got {self.device!r}")

    @property
    def hardware_key(self) -> str:
        """The kind of hardware that calibrations and fitted throughput constants are kept for (``cpu``, or
        ``cuda:`` and the per-GPU memory).

        >>> ClusterSpec(gpus_per_node=2, device="cpu").hardware_key, ClusterSpec(gpu_memory=80 * 2**30).hardware_key
        ('cpu', 'cuda:85899345920')
        """
        return "cpu" if self.device == "cpu" else f"cuda:{self.gpu_memory}"

    @property
    def world_size(self) -> int:
        """Data-parallel world size, as DeepSpeed's launcher counts it."""
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class TrainSpec:
    """What is trained on: the sequence length, precision, optimizer and attention. How it is trained (micro-batch,
    accumulation, ZeRO, checkpointing: what the search decides) is a :class:`tuner.workload.TrialConfig`."""

    seq_len: int = 2048
    precision: str = "bf16"
    optimizer: str = "adamw"
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len <= 0:
            raise WorkloadError("seq-len", f"must be a positive integer, got {self.seq_len!r}")
        if self.precision not in PRECISIONS:
            raise WorkloadError("precision", f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise WorkloadError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.attention not in ATTENTION_KINDS:
            raise WorkloadError("attention", f"must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}")


# TrainSpec's fields before the search's settings moved to tuner.workload.TrialConfig, at the values studies stored
# (the search decides them): still in fingerprints, so those of stored workloads do not change; dropped when an old
# stored dict is read (workload_from_dict).
LEGACY_TRAIN: dict[str, Any] = {"micro_batch": 1, "grad_accum": 1, "activation_checkpointing": False}

MAX_FREEZE_PATTERN = 1024  # characters of a --freeze regular expression


@dataclass(frozen=True)
class TrainableSpec:
    """Which of the model's parameters train: all of them (the default), or what a peft adapter and a freeze
    pattern leave trainable.

    ``peft``: a ``peft`` adapter config (the ``adapter_config.json`` object) as canonical JSON; its adapters are
    added to the model, and only they (with its ``modules_to_save`` copies) train. ``freeze``: a regular expression
    searched in parameter names as transformers names them (``model.embed_tokens.weight``); the parameters it
    matches are frozen (plain partial fine-tuning; with ``peft``, applied to the peft model's names too).
    The adapter's own fields are checked where the real ``peft`` library builds it (:mod:`tuner.profile`).
    ``quantization``: a 4-bit bitsandbytes base (QLoRA, :class:`tuner.workload.QuantSpec`) as canonical JSON;
    it needs an adapter (4-bit weights do not train) and CUDA (a :class:`Workload` on CPU refuses it).

    >>> TrainableSpec(freeze="embed").is_full, TrainableSpec().is_full
    (False, True)
    >>> TrainableSpec(freeze="(")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.spec.WorkloadError: freeze: not a regular expression RE2 can run (linear time): missing ): (
    """

    peft: str = ""
    freeze: str = ""
    quantization: str = ""

    def __post_init__(self) -> None:
        if self.quantization:
            try:
                QuantSpec.parse(self.quantization)  # checked field by field
            except InputError as error:
                raise WorkloadError(error.field, error.message) from None
            except json.JSONDecodeError as error:
                raise WorkloadError("quantization", f"not JSON: {error}") from None
            if not self.peft:
                raise WorkloadError(
                    "quantization", "a 4-bit base needs a peft adapter (--peft): its weights do not train"
                )
        if len(self.freeze) > MAX_FREEZE_PATTERN:
            raise WorkloadError("freeze", f"at most {MAX_FREEZE_PATTERN} characters")
        try:
            compile_pattern(self.freeze, "freeze")  # RE2: linear time, whatever the pattern
        except InputError as error:
            raise WorkloadError(error.field, error.message) from None
        if self.peft:
            try:
                adapter = json.loads(self.peft)
            except json.JSONDecodeError as error:
                raise WorkloadError("peft", f"not JSON: {error}") from None
            if not isinstance(adapter, dict):
                raise WorkloadError("peft", "must be a JSON object (peft's adapter_config.json)")

    @classmethod
    def of(
        cls, peft: dict[str, Any] | None = None, freeze: str | None = None, quantization: QuantSpec | None = None
    ) -> TrainableSpec:
        """From an adapter config object (canonicalised: key order and spacing do not change fingerprints)."""
        if peft is not None and not isinstance(peft, dict):
            raise WorkloadError("peft", "must be a JSON object (peft's adapter_config.json)")
        text = json.dumps(peft, sort_keys=True, separators=(",", ":")) if peft is not None else ""
        quant = quantization.canonical() if quantization is not None else ""
        return cls(peft=text, freeze=freeze or "", quantization=quant)

    @property
    def is_full(self) -> bool:
        """True when every parameter trains (no adapter, nothing frozen)."""
        return not self.peft and not self.freeze

    @property
    def peft_config(self) -> dict[str, Any] | None:
        """The adapter config object, or None without one."""
        return json.loads(self.peft) if self.peft else None

    @property
    def quant(self) -> QuantSpec | None:
        """The 4-bit base's spec, or None for a 16/32-bit base."""
        return QuantSpec.parse(self.quantization)

    def to_dict(self) -> dict[str, str]:
        """Plain fields (``quantization`` only when set: fingerprints of workloads stored before it stay)."""
        data = asdict(self)
        if not self.quantization:
            del data["quantization"]
        return data


@dataclass(frozen=True)
class Workload:
    """Model + cluster + training settings (+ which parameters train): the unit the tuner searches configs for."""

    model: ModelSpec
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    profile: ModelProfile | None = field(default=None, compare=False, repr=False)
    trainable: TrainableSpec = field(default_factory=TrainableSpec)

    def __post_init__(self) -> None:
        if self.trainable.quantization and self.cluster.device != "cuda":
            raise WorkloadError("quantization", NEEDS_CUDA)

    def fingerprint(self) -> str:
        """A stable hash of everything that decides memory and speed (the model's name is left out).

        The training settings that moved to :class:`tuner.workload.TrialConfig` are hashed at the values every study
        stored its workload with (:data:`LEGACY_TRAIN`), so stored workloads keep their fingerprints.
        """
        payload = workload_to_dict(self)
        del payload["model"]["name"]
        payload["train"].update(LEGACY_TRAIN)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


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
    out of bounds (negative, or above the limit): a :class:`WorkloadError` naming the field
    (``model.num_hidden_layers: must be at most 1024``).
    Pure and linear in the config's size: run before any model is described or built.

    Example:
        >>> check_config_limits({"model_type": "llama", "num_hidden_layers": 10**9})
        Traceback (most recent call last):
        tuner.workload.spec.WorkloadError: model.num_hidden_layers: must be at most 1024, got 1000000000
    """
    if not isinstance(config, dict):
        return
    if depth > MAX_CONFIG_DEPTH:
        raise WorkloadError(path, f"config objects nested deeper than {MAX_CONFIG_DEPTH} levels")
    for key, value in config.items():
        if isinstance(value, dict):
            check_config_limits(value, f"{path}.{key}", depth + 1)
            continue
        limit = CONFIG_LIMITS.get(key)
        if limit is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not value <= limit:  # NaN fails too
            raise WorkloadError(f"{path}.{key}", f"must be at most {limit}, got {value!r}")
        if value < 0:  # refused here, in pure Python, rather than by building the model off the request path
            raise WorkloadError(f"{path}.{key}", f"must not be negative, got {value!r}")


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
        hidden = _require_int(config, "n_embd", "hidden_size", default=768)
        heads = _require_int(config, "n_head", "num_attention_heads", default=12)
        return ModelSpec(
            name=name,
            family=family,
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
    kv_heads = _require_int(config, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise WorkloadError("model.num_key_value_heads", f"{kv_heads} does not divide {heads} attention heads")
    head_dim = _get(config, "head_dim") or _divide(hidden, heads, "model.num_attention_heads")
    if family == "llama":
        attention_bias = bool(config.get("attention_bias", False))
        qkv_bias, out_bias, mlp_bias = attention_bias, attention_bias, bool(config.get("mlp_bias", False))
        tie_default = False
    elif family == "qwen2":
        qkv_bias, out_bias, mlp_bias = True, False, False
        tie_default = False
    else:  # mistral
        qkv_bias = out_bias = mlp_bias = False
        tie_default = False
    return ModelSpec(
        **common,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        tie_embeddings=bool(config.get("tie_word_embeddings", tie_default)),
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


def read_json_object(source: str | Path, field_name: str, default_file: str = "") -> dict[str, Any]:
    """The JSON object in a file (or in ``default_file`` inside a folder); bad input names ``field_name``."""
    path = Path(source)
    if path.is_dir() and default_file:
        path = path / default_file
    if not path.is_file():
        raise WorkloadError(field_name, f"no such file: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WorkloadError(field_name, f"cannot read {path} as JSON: {error}") from None
    if not isinstance(data, dict):
        raise WorkloadError(field_name, f"{path} must hold a JSON object")
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
        return read_json_object(path, "model"), path.parent.name or path.stem
    return preset_config(source), source


def load_builtin_model(source: str) -> ModelSpec:
    """dstune's built-in model (gpt2, llama, mistral, qwen2, gpt_neox only: :data:`SUPPORTED_FAMILIES`) of a preset
    name or a path to a Hugging Face ``config.json`` (or a folder holding one). Pure Python, shapes and formula
    activations, no torch. Any other architecture, and the transformers model itself (exact parameters, traced
    activations): :func:`tuner.profile.load_model`, the one public way to get a model from a preset or a path."""
    config, name = load_hf_config(source)
    return model_from_hf_config(config, name=name)


def model_from_param_count(n_params: float) -> ModelSpec:
    """A bare parameter count (``--params 7.5e9``): model states only, activations unknown."""
    if isinstance(n_params, bool) or not math.isfinite(n_params) or n_params < 1:
        raise WorkloadError("params", f"must be a positive number of parameters, got {n_params!r}")
    count = int(n_params)
    return ModelSpec(name=f"{count:.3g} params", family="params", bare_params=count)


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """Plain JSON-ready fields of a workload (the inverse of :func:`workload_from_dict`); ``trainable`` only when
    some parameters are frozen, so full fine-tuning workloads keep the fingerprints they were stored under."""
    data = {"model": workload.model.to_dict(), "cluster": asdict(workload.cluster), "train": asdict(workload.train)}
    if not workload.trainable.is_full:
        data["trainable"] = workload.trainable.to_dict()
    return data


def workload_from_dict(data: dict[str, Any]) -> Workload:
    """Rebuild a workload from :func:`workload_to_dict`'s output (or an older one's, whose ``train`` still holds
    the :data:`LEGACY_TRAIN` fields: they are dropped)."""
    train = {key: value for key, value in data["train"].items() if key not in LEGACY_TRAIN}
    return Workload(
        ModelSpec(**data["model"]),
        ClusterSpec(**data["cluster"]),
        TrainSpec(**train),
        trainable=TrainableSpec(**data.get("trainable", {})),
    )
