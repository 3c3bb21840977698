"""The model being trained (:class:`ModelSpec`): a decoder-only transformer described by the shapes that decide its
memory, or a bare parameter count (:func:`model_from_param_count`).

Pure Python. For gpt2, llama, mistral, qwen2 and gpt_neox the parameter count is computed here from the shapes and
equals what transformers instantiates, to the parameter (``tests/workload/test_spec.py``); any other causal LM
transformers ships is described by :mod:`tuner.profile`, which counts the parameters on the meta device and fills
:attr:`ModelSpec.numels`. Shapes come from a Hugging Face ``config.json`` or a preset: :mod:`tuner.workload.hf_config`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Literal

from tuner.workload.errors import WorkloadError
from tuner.workload.vocabulary import MODEL_IMPLS

UNKNOWN_FAMILY = "unknown"  # a training command's own model, not described to dstune (no --model)
# Fields added after workloads were first stored: left out of dicts (and fingerprints) while at their defaults.
OPTIONAL_MODEL_FIELDS = {
    "architecture": "",
    "implementation": "builtin",
    "hf_config": "",
    "numels": (),
    "replicated": (),
    "experts": (),
    "position_table": 0,
}


def layer_runs(value: Callable[[str], Any], layers: int) -> list[int]:
    """How many times each of the ``layers`` decoder layers runs in one forward pass, the config's fields read
    through ``value``: once, except the recurrent block of a looped model (Dory's ``n_recurrent_layers`` after its
    ``n_input_layers``, run ``n_recurrent_loops`` times, each run saving its own tensors)."""
    runs = [1] * layers
    loops, start, count = (value(name) for name in ("n_recurrent_loops", "n_input_layers", "n_recurrent_layers"))
    if all(isinstance(field, int) and not isinstance(field, bool) for field in (loops, start, count)) and loops > 1:
        for index in range(start, min(start + count, layers)):
            runs[index] = loops
    return runs


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, described by the shapes that decide its memory.

    ``family == "params"`` is a bare parameter count: model states can be estimated, activations cannot.
    ``implementation``: the model measured runs train, dstune's built-in one or the transformers one built from
    ``hf_config`` (its canonical JSON); ``numels``: the parameters' element counts when counted by transformers
    (any ``model_type``), else derived from the shapes; ``architecture``: transformers' class name; ``replicated``:
    only in the estimator's view of one AutoTP rank (``numels`` then its shards), which of them every tensor-parallel
    rank holds whole (empty: not such a view); ``experts``: only in the estimator's view of one AutoEP rank
    (``numels`` then its local experts), which of them are routed-expert weights (empty: not such a view).
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
    replicated: tuple[bool, ...] = ()
    experts: tuple[bool, ...] = ()
    position_table: int = 0  # rows of a transformers model's learned position table (its profile), 0: none

    def __post_init__(self) -> None:
        if not isinstance(self.numels, tuple):  # JSON gives a list
            object.__setattr__(self, "numels", tuple(self.numels))
        if self.implementation not in MODEL_IMPLS:
            raise WorkloadError("model-impl", f"must be builtin or transformers, got {self.implementation!r}")

    @cached_property
    def text_config(self) -> dict[str, Any]:
        """The transformers config of the language model (a multimodal config's ``text_config``); empty without
        one."""
        if not self.hf_config:
            return {}
        config = json.loads(self.hf_config)
        return config.get("text_config") or config

    @property
    def routed_experts(self) -> int:
        """Routed experts per MoE layer in the transformers config (0: dense, or no config).

        Example:
            >>> ModelSpec("m", "mixtral", hf_config='{"num_local_experts": 8}').routed_experts
            8
        """
        config = self.text_config
        return int(config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts") or 0)

    @property
    def layer_passes(self) -> int:
        """Decoder-layer runs in one forward pass: ``num_layers``, plus the extra runs of a looped block (Dory's
        ``n_recurrent_layers`` after its ``n_input_layers``, run ``n_recurrent_loops`` times).

        Example:
            >>> loop = '{"n_recurrent_loops": 3, "n_input_layers": 1, "n_recurrent_layers": 2}'
            >>> ModelSpec("m", "dory", num_layers=4, hf_config=loop).layer_passes
            8
        """
        return sum(layer_runs(self.text_config.get, self.num_layers))

    @property
    def is_unknown(self) -> bool:
        """True for a training command's own model given without ``--model`` (:func:`unknown_model`): neither its
        shapes nor its parameter count are known, so nothing about it can be estimated."""
        return self.family == UNKNOWN_FAMILY

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

    @property
    def position_limit(self) -> int:
        """The longest sequence the model can index: the rows of its learned position table (GPT-2's ``wpe``, OPT's
        offset table), 0 when positions are computed (rotary, ALiBi) and a longer sequence still runs."""
        return self.max_positions if self.learned_positions else self.position_table

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON and fingerprints (fields added later are left out at their defaults)."""
        data = asdict(self)
        for name, default in OPTIONAL_MODEL_FIELDS.items():
            if data[name] == default:
                del data[name]
        for name in ("numels", "replicated", "experts"):
            if name in data:
                data[name] = list(data[name])
        return data


def unknown_model(command: str) -> ModelSpec:
    """The model of a training command tuned without ``--model``: a custom ``nn.Module`` dstune knows nothing of,
    told apart by ``command`` (a digest of the command: two commands' models are two workloads). Studies of it
    prune nothing before a run and learn the memory boundary from the runs.

    >>> model = unknown_model("3f2a9c1d")
    >>> model.is_unknown, model.n_params, model.architecture
    (True, 0, 'command 3f2a9c1d')
    """
    return ModelSpec(name=f"command-{command}", family=UNKNOWN_FAMILY, architecture=f"command {command}")


def model_from_param_count(n_params: float) -> ModelSpec:
    """A bare parameter count (``--params 7.5e9``): model states only, activations unknown."""
    if isinstance(n_params, bool) or not math.isfinite(n_params) or n_params < 1:
        raise WorkloadError("params", f"must be a positive number of parameters, got {n_params!r}")
    count = int(n_params)
    return ModelSpec(name=f"{count:.3g} params", family="params", bare_params=count)
