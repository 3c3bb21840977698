"""The model profile: what the estimator needs to know about a transformers model, as plain data (no torch).

A :class:`ModelProfile` holds the exact parameter facts (counted on the ``meta`` device) and zero or more
:class:`ActivationProfile` entries, each the bytes autograd saves for backward in one forward pass, traced under fake
tensors for one sequence length, precision, attention and MoE experts implementation, and checkpointing setting.

Activation bytes are stored per part as :class:`Linear` functions of the micro-batch (``fixed + per_sample × b``,
traced at micro-batch 1, 2 and 3; exact where the kernels scale linearly). A model of ``L`` layers saves
``outside + first_extra + Σ_layers layers[kind(layer)]``: ``outside`` is what the embeddings, final norm, LM head and
loss save; ``layers[kind]`` what one layer of that kind saves; ``first_extra`` what the first layer of each kind saves
beyond the others (tensors every layer shares, such as rotary tables or masks, saved once).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any

# 2: the attention transformers resolves, traces call the model as training does; 3: tied_embeddings, expert_modules
# 4: dims carry the learned position table's rows
# 5: traces see no padding in a mask the model makes itself (BART's decoder); attention is the text model's;
# states a training call leaves held in its caches and modules count
# 6: the position table's limit is the positions a sequence may index (OPT's offset, the RoBERTa family's padding
# offset: 510 of 512); traces deep-copy fake tensors as fake and refuse a layer that runs twice per forward (Dory)
# 7: checkpointing entries carry the recomputed layer's worst moment in its backward (backward_peak)
# 8: entries carry what the forward pass holds before the first layer (pre_layer_peak, pre_layer_held)
# 9: entries carry a layer's backward excess over its saved tensors (backward_excess)
# 10: position tables stop where ProphetNet's predicting stream does; copies cut through the field counting
#     the decoder layers (LongCat-Flash's num_layers); weights transformers leaves in fp32 cast (XLNet's)
# 11: entries carry what a layer's MLP block saves (mlp_saved: what a tiled MLP drops); which parameters AutoTP
#     shards, read from the model's tp_plan (tp_sharded)
PROFILE_FORMAT = 11


@dataclass(frozen=True, slots=True)
class Linear:
    """``fixed + per_sample × micro_batch`` bytes from micro-batch 2 on, ``single`` at micro-batch 1.

    Micro-batch 1 is its own point: some kernels take another path for a batch of one (eager attention's batched
    matmuls fold the batch away and save other tensors), so the line is fitted through micro-batch 2 and 3.
    """

    fixed: int = 0
    per_sample: int = 0
    single: int | None = None

    def at(self, micro_batch: int) -> int:
        """Bytes at ``micro_batch`` samples."""
        if micro_batch == 1 and self.single is not None:
            return self.single
        return self.fixed + self.per_sample * micro_batch

    @classmethod
    def through(cls, at_one: int, at_two: int, at_three: int) -> Linear:
        """The bytes traced at micro-batch 1, 2 and 3."""
        return cls(3 * at_two - 2 * at_three, at_three - at_two, at_one)


@dataclass(frozen=True)
class ActivationProfile:
    """Saved-for-backward bytes of one configuration of the model, by part, as functions of the micro-batch.

    ``recompute``: with checkpointing, the extra bytes while one layer is recomputed in backward (the largest layer
    kind's saved bytes without checkpointing); 0 without checkpointing. ``backward_peak``: with checkpointing, that
    layer's live bytes at the worst moment of its backward (its saved tensors partly freed, backward's temporaries
    beside them: :mod:`tuner.profile.working_sets`); ``backward_peak_outside_mlp`` the same outside its MLP's
    backward, without the MLP's tensors (the layer under a tiled MLP); both 0 where not traced. ``backward_excess``
    (``_outside_mlp``): that moment's excess over what the layer held when its backward started (its saved tensors),
    the first layer's backward on top of every saved tensor without checkpointing. ``pre_layer_peak``,
    ``pre_layer_held``: the forward pass's worst moment before the first decoder layer and what it still holds then
    beside the layer's input (masks the model builds), parameters not counted. ``mlp_saved``: what one layer's MLP
    block saves for backward (what DeepSpeed's ``TiledMLP`` drops; 0 where not traced). ``adapters``: for
    the model as trained (peft, frozen parameters), how it was traced: ``""`` as ZeRO 0-2 train it (adapters cast to
    the training dtype); ``zero3`` as ZeRO-3 does (peft's fp32 adapters kept, and every Linear saving its input under
    ``zero.Init``'s memory-efficient linear); ``fp32`` the adapters kept, Linear as torch's.
    """

    seq_len: int
    precision: str
    attention: str
    experts: str
    checkpointing: bool
    outside: Linear
    first_extra: Linear
    layers: dict[str, Linear]
    recompute: Linear = Linear()
    adapters: str = ""
    backward_peak: Linear = Linear()
    backward_peak_outside_mlp: Linear = Linear()
    pre_layer_peak: Linear = Linear()
    pre_layer_held: Linear = Linear()
    backward_excess: Linear = Linear()
    backward_excess_outside_mlp: Linear = Linear()
    mlp_saved: Linear = Linear()

    @property
    def key(self) -> tuple[int, str, str, bool, str]:
        """The settings this entry was traced for."""
        return (self.seq_len, self.precision, self.attention, self.checkpointing, self.adapters)

    def saved_bytes(self, layer_counts: dict[str, int], micro_batch: int) -> int:
        """Saved bytes after the forward pass of the whole model at ``micro_batch``."""
        total = self.outside.at(micro_batch) + self.first_extra.at(micro_batch)
        for kind, count in layer_counts.items():
            total += count * self.layers[kind].at(micro_batch)
        return total

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (``adapters`` only for a peft model's fp32-adapter entry)."""
        data = asdict(self)
        if not self.adapters:
            del data["adapters"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActivationProfile:
        """Inverse of :meth:`to_dict`."""
        required = ("outside", "first_extra")  # the rest default to 0 (entries of older formats lack them)
        lines: dict[str, Any] = {
            name: Linear(**(data[name] if name in required else data.get(name, {}))) for name in cls.linear_fields()
        }
        return cls(
            seq_len=int(data["seq_len"]),
            precision=str(data["precision"]),
            attention=str(data["attention"]),
            experts=str(data["experts"]),
            checkpointing=bool(data["checkpointing"]),
            layers={kind: Linear(**value) for kind, value in data["layers"].items()},
            adapters=str(data.get("adapters", "")),
            **lines,
        )

    @classmethod
    def linear_fields(cls) -> tuple[str, ...]:
        """The fields that are one :class:`Linear` each (bytes as functions of the micro-batch), ``layers`` aside."""
        return tuple(item.name for item in fields(cls) if item.type in ("Linear", Linear))


@dataclass(frozen=True)
class ModelProfile:
    """Parameter facts of a transformers model and its traced activation profiles.

    ``param_numels``: elements of every unique parameter in model order (tied weights once), as ZeRO partitions
    them; ``param_elements_by_dtype``: elements per dtype as the model is built in ``dtype=bf16`` (some models keep
    fp32 weights); ``layer_kinds``: the kind of each decoder layer (layers whose parameter shapes and attention type
    match are one kind); ``dims``: the config's shapes (vocabulary, hidden size, heads...); ``attention``: the
    attention kind transformers builds the decoder layers with when none is asked for (``sdpa`` where the class
    supports it, else ``eager``; a composite model's text model, whatever its vision tower runs), the default of
    workloads training it; ``supports_checkpointing``: whether transformers can
    checkpoint its layers (else no checkpointing profile is traced, and one asked for is refused);
    ``tied_embeddings``: the LM head is the input embedding's parameter; ``expert_modules``: an MoE whose experts are
    modules of their own, each run only for the tokens routed to it
    (which modules run changes every step), rather than one fused experts module that runs every time.

    The model as trained (a workload with an adapter or frozen parameters, :mod:`tuner.profile.trainable`) is the
    peft model: ``param_numels`` are all its parameters (frozen base, adapters, ``modules_to_save`` copies) and
    ``trainable`` says which train (empty: all of them); ``param_dtypes`` the dtype of each as built in bf16 (peft
    keeps its adapters fp32 beside a 16-bit base); ``trainable_elements_by_dtype`` / ``frozen_elements_by_dtype``
    and the largest trainable and frozen parameters summarise them. With a 4-bit bitsandbytes base
    (``TrainableSpec.quantization``), ``quantized`` says which parameters transformers would replace by 4-bit
    ``Params4bit`` (empty: none); their ``param_numels`` stay the unquantized element counts. ``tp_sharded``: which
    parameters DeepSpeed's AutoTP shards, read from the model's ``tp_plan`` (:mod:`tuner.profile.tp_plan`; empty:
    no plan DeepSpeed takes, or the model as trained).
    """

    model_type: str
    architecture: str
    transformers_version: str
    n_params: int
    param_numels: tuple[int, ...]
    param_elements_by_dtype: dict[str, int]
    largest_param_name: str
    largest_param_numel: int
    layer_kinds: tuple[str, ...]
    dims: dict[str, int] = field(default_factory=dict)
    attention: str = "sdpa"
    supports_checkpointing: bool = True
    tied_embeddings: bool = False
    expert_modules: bool = False
    activations: tuple[ActivationProfile, ...] = field(default=())
    trainable: tuple[bool, ...] = ()
    param_dtypes: tuple[str, ...] = ()
    trainable_elements_by_dtype: dict[str, int] = field(default_factory=dict)
    frozen_elements_by_dtype: dict[str, int] = field(default_factory=dict)
    largest_trainable_name: str = ""
    largest_trainable_numel: int = 0
    largest_frozen_name: str = ""
    largest_frozen_numel: int = 0
    quantized: tuple[bool, ...] = ()
    tp_sharded: tuple[bool, ...] = ()

    @property
    def is_full(self) -> bool:
        """True when every parameter trains."""
        return not self.trainable or all(self.trainable)

    @property
    def trainable_params(self) -> int:
        """Elements that train."""
        if not self.trainable:
            return self.n_params
        return sum(n for n, train in zip(self.param_numels, self.trainable, strict=True) if train)

    @property
    def n_layers(self) -> int:
        """Decoder layers."""
        return len(self.layer_kinds)

    @cached_property
    def layer_counts(self) -> dict[str, int]:
        """How many layers of each kind."""
        counts: dict[str, int] = {}
        for kind in self.layer_kinds:
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def activation(
        self, seq_len: int, precision: str, attention: str, checkpointing: bool, adapters: str = ""
    ) -> ActivationProfile | None:
        """The traced profile for these settings, or None when it was not traced."""
        for entry in self.activations:
            if entry.key == (seq_len, precision, attention, checkpointing, adapters):
                return entry
        return None

    def activation_bytes(
        self, seq_len: int, precision: str, attention: str, checkpointing: bool, micro_batch: int, adapters: str = ""
    ) -> tuple[int, int] | None:
        """(saved bytes after forward, extra bytes while one layer is recomputed), or None when not traced."""
        entry = self.activation(seq_len, precision, attention, checkpointing, adapters)
        if entry is None:
            return None
        return entry.saved_bytes(self.layer_counts, micro_batch), entry.recompute.at(micro_batch)

    def with_activations(self, entries: tuple[ActivationProfile, ...]) -> ModelProfile:
        """A copy holding ``entries`` beside (or instead of, for the same settings) the ones it has."""
        keys = {e.key for e in entries}
        kept = tuple(e for e in self.activations if e.key not in keys)
        return ModelProfile(**{**self._static_fields(), "activations": kept + tuple(entries)})

    def without_activations(self) -> ModelProfile:
        """The parameter facts alone."""
        return ModelProfile(**self._static_fields())

    def _static_fields(self) -> dict[str, Any]:
        trained: dict[str, Any] = {}
        if self.trainable:  # the model as trained (only then: full models keep their cached files' bytes)
            trained = {
                "trainable": self.trainable,
                "param_dtypes": self.param_dtypes,
                "trainable_elements_by_dtype": dict(self.trainable_elements_by_dtype),
                "frozen_elements_by_dtype": dict(self.frozen_elements_by_dtype),
                "largest_trainable_name": self.largest_trainable_name,
                "largest_trainable_numel": self.largest_trainable_numel,
                "largest_frozen_name": self.largest_frozen_name,
                "largest_frozen_numel": self.largest_frozen_numel,
            }
            if self.quantized:
                trained["quantized"] = self.quantized
        if self.tp_sharded:
            trained["tp_sharded"] = self.tp_sharded
        return {
            **trained,
            **{
                "model_type": self.model_type,
                "architecture": self.architecture,
                "transformers_version": self.transformers_version,
                "n_params": self.n_params,
                "param_numels": self.param_numels,
                "param_elements_by_dtype": dict(self.param_elements_by_dtype),
                "largest_param_name": self.largest_param_name,
                "largest_param_numel": self.largest_param_numel,
                "layer_kinds": self.layer_kinds,
                "dims": dict(self.dims),
                "attention": self.attention,
                "supports_checkpointing": self.supports_checkpointing,
                "tied_embeddings": self.tied_embeddings,
                "expert_modules": self.expert_modules,
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (the disk cache's format)."""
        data = self._static_fields()
        data["format"] = PROFILE_FORMAT
        data["param_numels"] = list(self.param_numels)
        data["layer_kinds"] = list(self.layer_kinds)
        if self.trainable:
            data["trainable"] = [int(flag) for flag in self.trainable]
            data["param_dtypes"] = list(self.param_dtypes)
        for name in ("quantized", "tp_sharded"):
            if getattr(self, name):
                data[name] = [int(flag) for flag in getattr(self, name)]
        data["activations"] = [entry.to_dict() for entry in self.activations]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelProfile:
        """Inverse of :meth:`to_dict`."""
        if data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"profile format {data.get('format')!r} is not {PROFILE_FORMAT}")
        return cls(
            model_type=str(data["model_type"]),
            architecture=str(data["architecture"]),
            transformers_version=str(data["transformers_version"]),
            n_params=int(data["n_params"]),
            param_numels=tuple(int(n) for n in data["param_numels"]),
            param_elements_by_dtype={str(k): int(v) for k, v in data["param_elements_by_dtype"].items()},
            largest_param_name=str(data["largest_param_name"]),
            largest_param_numel=int(data["largest_param_numel"]),
            layer_kinds=tuple(str(kind) for kind in data["layer_kinds"]),
            dims={str(k): int(v) for k, v in data.get("dims", {}).items()},
            attention=str(data["attention"]),
            supports_checkpointing=bool(data["supports_checkpointing"]),
            tied_embeddings=bool(data["tied_embeddings"]),
            expert_modules=bool(data["expert_modules"]),
            activations=tuple(ActivationProfile.from_dict(entry) for entry in data.get("activations", ())),
            trainable=tuple(bool(flag) for flag in data.get("trainable", ())),
            param_dtypes=tuple(str(name) for name in data.get("param_dtypes", ())),
            trainable_elements_by_dtype={
                str(k): int(v) for k, v in data.get("trainable_elements_by_dtype", {}).items()
            },
            frozen_elements_by_dtype={str(k): int(v) for k, v in data.get("frozen_elements_by_dtype", {}).items()},
            largest_trainable_name=str(data.get("largest_trainable_name", "")),
            largest_trainable_numel=int(data.get("largest_trainable_numel", 0)),
            largest_frozen_name=str(data.get("largest_frozen_name", "")),
            tp_sharded=tuple(bool(flag) for flag in data.get("tp_sharded", ())),
            largest_frozen_numel=int(data.get("largest_frozen_numel", 0)),
            quantized=tuple(bool(flag) for flag in data.get("quantized", ())),
        )
