"""Where a built transformers model keeps its parts: the text config, its decoder layers, a learned position table,
a tied LM head, expert modules, and a kind per layer. Imports torch (on a model transformers built)."""

from __future__ import annotations

from typing import Any

from torch import nn

from tuner.workload import WorkloadError
from tuner.workload.model import layer_runs as loop_runs


def text_config(config_object: Any) -> Any:
    """The config of the language model: the config itself, or a composite model's text config."""
    try:
        return config_object.get_text_config()
    except (AttributeError, ValueError):
        return config_object


def config_value(config_object: Any, name: str) -> Any:
    """A config attribute, or None; a per-layer attribute of a heterogeneous config (transformers'
    ``AmbiguousGlobalPerLayerAttributeError``) is read as its global value."""
    try:
        return getattr(config_object, name, None)
    except RuntimeError:
        reader = getattr(config_object, "_getattr_without_heterogeneous_validation", None)
        return reader(name, None) if reader is not None else None


DEPTH_FIELDS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "decoder_layers")


def depth_field(config_object: Any, layers: int) -> str:
    """The config field that counts the model's ``layers`` decoder layers: ``num_hidden_layers``, unless that counts
    something else (LongCat-Flash's is a property, twice ``num_layers``: two attention sublayers per layer, and
    setting it sets ``num_layers`` to half the value)."""
    for name in DEPTH_FIELDS:
        if config_value(config_object, name) == layers:
            return name
    return "num_hidden_layers"


OTHER_TOWERS = ("vision", "visual", "audio", "image", "encoder", "speech", "patch")


def position_table(model: Any) -> int:  # a transformers PreTrainedModel
    """The positions a learned position table lets a sequence index, or 0 (rotary, ALiBi: nothing to index).

    The table is an embedding other than the tokens' with ``max_position_embeddings`` rows or up to 2 more; a sequence
    may use its rows less the ones its position ids skip: OPT's and BART's tables start at their ``offset`` (2), the
    RoBERTa family's count from ``padding_idx + 1`` (2 rows fewer than the table: 510 of 512), GPT-2's ``wpe`` and
    Blenderbot's from 0. ProphetNet's n-gram predicting streams index one row past the main stream's. Whisper's
    decoder names its positions ``max_target_positions``; CTRL keeps a fixed sinusoidal table as a
    ``[positions, hidden]`` buffer."""
    config = text_config(model.config)
    positions = config_value(config, "max_position_embeddings") or config_value(config, "max_target_positions")
    if not isinstance(positions, int) or isinstance(positions, bool) or positions <= 0:
        return 0
    try:
        tokens = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        tokens = None
    for name, module in model.named_modules():
        rows = module.num_embeddings if isinstance(module, nn.Embedding) and module is not tokens else 0
        if positions <= rows <= positions + 2 and _names_positions(name):
            offset = getattr(module, "offset", None)
            if not isinstance(offset, int):
                offset = 0 if module.padding_idx is None else module.padding_idx + 1
            streams_ahead = 1 if isinstance(config_value(config, "ngram"), int) else 0  # ProphetNet's position + 1
            return rows - offset - streams_ahead
    hidden = config_value(config, "hidden_size")
    for name, buffer in model.named_buffers():  # a fixed sinusoidal [positions, hidden] table (CTRL's pos_encoding)
        if buffer.dim() == 2 and tuple(buffer.shape) == (positions, hidden) and _names_positions(name):
            return positions
    return 0


def _names_positions(name: str) -> bool:
    """Whether a module or buffer's own name says it holds positions (``wpe``, ``embed_positions``,
    ``position_embeddings``, ``pos_encoding``), not another table that happens to have as many rows (Gemma-3n's
    per-layer token embeddings in a small config)."""
    last = name.rsplit(".", 1)[-1].lower()
    return last == "wpe" or "pos" in last


def tied_embeddings(model: Any) -> bool:  # a transformers PreTrainedModel
    """True when the model's LM head is its input embedding's parameter (one tensor, counted once)."""
    try:
        inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    weight = getattr(inputs, "weight", None)
    return weight is not None and getattr(outputs, "weight", None) is weight


def expert_modules(model: nn.Module) -> bool:
    """True when an MoE's experts are modules of their own (a module named ``*experts`` with more than one child
    holding parameters: switch_transformers' ``expert_0``...), which run only for the tokens routed to them; False
    for dense models and for experts fused into one module's stacked parameters (Mixtral, Qwen-MoE, DeepSeek in
    transformers 5), which runs every time."""
    return any(
        name.rsplit(".", 1)[-1].endswith("experts")
        and sum(1 for child in module.children() if any(True for _ in child.parameters())) > 1
        for name, module in model.named_modules()
    )


def decoder_layers(model: Any) -> nn.ModuleList:  # a transformers PreTrainedModel
    """The model's list of decoder layers: the ``ModuleList`` as long as ``num_hidden_layers`` (of the text config)
    nearest the top, outside vision or audio towers; else one named like a tower (a text stack BERT-style named
    ``encoder``: CPM-Ant's, GIT's); else one as long as ``decoder_layers`` (the causal LM of an encoder-decoder
    family, BART's, Blenderbot-small's, whose ``num_hidden_layers`` counts the encoder's layers); else the list
    nearest the top whose length divides ``num_hidden_layers`` (layers of several sublayers each, counted one by
    one: LongCat-Flash's)."""
    count = config_value(text_config(model.config), "num_hidden_layers")
    decoder_count = config_value(text_config(model.config), "decoder_layers")
    lists = [
        (name.count("."), name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) > 0
    ]
    outside = [item for item in lists if not any(tower in item[1].lower() for tower in OTHER_TOWERS)]
    for found in (
        [item for item in outside if len(item[2]) == count],
        [item for item in lists if len(item[2]) == count],
        [item for item in outside if isinstance(decoder_count, int) and len(item[2]) == decoder_count],
        [item for item in outside if isinstance(count, int) and len(item[2]) > 1 and count % len(item[2]) == 0],
    ):
        if found:
            return min(found, key=lambda item: item[:2])[2]
    raise WorkloadError("model.model_type", f"no list of {count} decoder layers found in {type(model).__name__}")


def parallel_layer_lists(model: nn.Module, layers: nn.ModuleList) -> tuple[nn.Module, list[nn.ModuleList]]:
    """The module holding ``layers`` (``model`` if none does) and the lists beside it as long as it, in registration
    order: more than one where each decoder layer is split over parallel lists (XLM's ``attentions``,
    ``layer_norm1``, ``ffns``, ``layer_norm2``, with functional dropout and masking between them), else
    ``[layers]``."""
    for parent in model.modules():
        children = list(parent.children())
        if any(child is layers for child in children):
            return parent, [c for c in children if isinstance(c, nn.ModuleList) and len(c) == len(layers)]
    return model, [layers]


def replace_module(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` wherever ``old`` is a child module in ``model``."""
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if child is old:
                setattr(parent, name, new)


def layer_kinds(model: Any) -> list[str]:  # a transformers PreTrainedModel
    """A kind per decoder layer: layers with equal parameter shapes, attention type and runs per forward pass
    (:func:`layer_runs`) share a kind: ``L<i>``, ``i`` the index of the first layer of that kind, or ``L<i>x<n>``
    for a layer run ``n`` times (a looped block), whose traced bytes are those of its ``n`` runs."""
    config = text_config(model.config)
    layer_types = config_value(config, "layer_types")
    layers = decoder_layers(model)
    runs = layer_runs(config, len(layers))
    kinds: list[str] = []
    first_of: dict[Any, int] = {}
    for index, layer in enumerate(layers):
        signature = tuple((name, tuple(p.shape), p.dtype) for name, p in layer.named_parameters())
        attention_type = layer_types[index] if isinstance(layer_types, (list, tuple)) else None
        key = (signature, attention_type, runs[index])
        first_of.setdefault(key, index)
        kinds.append(f"L{first_of[key]}" if runs[index] == 1 else f"L{first_of[key]}x{runs[index]}")
    return kinds


def layer_runs(config_object: Any, layers: int) -> list[int]:
    """How many times each of the ``layers`` decoder layers of ``config_object`` runs in one forward pass
    (:func:`tuner.workload.model.layer_runs`: Dory's looped block runs more than once)."""
    return loop_runs(lambda name: config_value(config_object, name), layers)


def kind_runs(kind: str) -> int:
    """The runs per forward pass of a layer of ``kind`` (:func:`layer_kinds`' names)."""
    return int(kind.partition("x")[2] or 1)
