"""Saved activations traced from the real transformers model under fake tensors (imports torch and transformers).

A copy of the model holding the first two layers of each layer kind runs its forward pass under PyTorch's
``FakeTensorMode`` (shapes and dtypes only: no memory, no arithmetic) at micro-batch 1, 2 and 3. A
``saved_tensors_hooks`` pack hook records each tensor autograd saves, with the decoder layer running at the time;
after the forward pass every storage still alive is counted once (parameters and buffers excluded). The same
counting runs on real CPU tensors (:func:`saved_bytes_by_layer` with ``fake=False``): fake and real are byte-equal.

Pitfalls (FIELD_NOTES): no attention mask is passed (an all-ones mask would be materialised); the MoE experts
implementation is the one training runs (transformers' default); the ``meta`` device is not fake mode. transformers
looks for packed sequences in the position ids and, unable to read fake values, would build a causal mask and lose
grouped-query SDPA; the trace tells it there are none, as for the real unpacked batches (:func:`_fake_safe`).
Composite models (Gemma-3, Qwen3.5...) are traced whole, their text config's decoder layers standing for the layer
kinds. Recurrent models (their layers step through the sequence, so a trace's cost grows with its length) are traced
at short lengths and extrapolated where exactly linear (:func:`_traced_parts`).
PyTorch's fake ``grouped_mm`` accepts only bf16 (the CPU kernel also runs fp32): other precisions trace a stand-in
saving what the kernel saves (:class:`_GroupedMM`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers.masking_utils
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tuner.profile.hf import (
    TORCH_DTYPES,
    build,
    decoder_layers,
    enable_checkpointing,
    hf_config,
    quiet,
    replace_module,
    text_config,
)
from tuner.workload import ActivationProfile, Linear, TrainableSpec, WorkloadError

OUTSIDE = -1


def _storage_id(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


@contextlib.contextmanager
def _marked_layers(layers: nn.ModuleList, state: dict[str, int]) -> Iterator[None]:
    """While inside, ``state["layer"]`` is the index of the decoder layer running (``OUTSIDE`` between layers).

    Module hooks run outside transformers' gradient checkpointing (it checkpoints ``forward``), so the inputs it
    saves count as that layer's.
    """
    handles = []
    for index, layer in enumerate(layers):

        def enter(module: nn.Module, args: Any, _index: int = index) -> None:
            state["layer"] = _index

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            state["layer"] = OUTSIDE

        handles.append(layer.register_forward_pre_hook(enter))
        handles.append(layer.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class _GroupedMM(torch.autograd.Function):
    """``grouped_mm`` under fake tensors in any dtype (PyTorch's fake kernel is bf16-only): the output's shape, and
    what the real kernel saves for backward (weight, offsets, input)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight, offs, input)
        return input.new_empty(input.shape[0], weight.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        weight, _, input = ctx.saved_tensors
        return torch.empty_like(input), torch.empty_like(weight), None


def _fake_grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return _GroupedMM.apply(input, weight, offs)


@contextlib.contextmanager
def _fake_safe(model: nn.Module) -> Iterator[None]:
    """transformers sees no packed sequences (what it finds for real unpacked batches, unreadable on fake ones) and,
    outside bf16, ``grouped_mm`` is :class:`_GroupedMM` (fake ``grouped_mm`` is bf16-only; the CPU kernel runs
    fp32 too)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(transformers.masking_utils, "find_packed_sequence_indices", lambda ids: None))
        if next(model.parameters()).dtype != torch.bfloat16:
            for module, name in ((torch.nn.functional, "grouped_mm"), (torch, "_grouped_mm")):
                if hasattr(module, name):
                    stack.enter_context(_patched(module, name, _fake_grouped_mm))
        yield


def saved_bytes_by_layer(
    model: Any,
    micro_batch: int,
    seq_len: int,
    fake_mode: FakeTensorMode | None = None,
    counted: list[int] | None = None,
) -> dict[int, int]:
    """Bytes autograd saves in one forward pass, by decoder layer index (``OUTSIDE`` for the rest).

    The model is called as a training loop calls it (train mode, ``model(input_ids, labels=...)``): ``use_cache``
    is the config's, as in training (some models then save other tensors: GPT-NeoX, Qwen3-Next). Each storage
    counts once, for the first layer that saved it, if still alive after the forward pass. ``counted`` (if given)
    gets the number of tensors saved.
    """
    layers = decoder_layers(model)
    excluded = {_storage_id(t) for t in (*model.parameters(), *model.buffers())}
    state = {"layer": OUTSIDE}
    records: list[tuple[weakref.ref, int, int, int]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        records.append((weakref.ref(storage), storage._cdata, storage.nbytes(), state["layer"]))
        return tensor

    model.train()
    with fake_mode or contextlib.nullcontext():
        tokens = torch.randint(0, text_config(model.config).vocab_size, (micro_batch, seq_len))
        with (
            _fake_safe(model) if fake_mode is not None else contextlib.nullcontext(),
            _marked_layers(layers, state),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            loss = model(input_ids=tokens, labels=tokens).loss  # as a training loop calls it: the config's use_cache
        if counted is not None:
            counted.append(len(records))
        owner: dict[int, tuple[int, int]] = {}
        for ref, storage_id, nbytes, layer in records:
            if ref() is not None and storage_id not in excluded and storage_id not in owner:
                owner[storage_id] = (layer, nbytes)
        records.clear()
        del loss  # no backward: what is counted is what the forward pass saved (backward was 2/3 of a trace's time)
    totals: dict[int, int] = {}
    for layer, nbytes in owner.values():
        totals[layer] = totals.get(layer, 0) + nbytes
    return totals


def _representatives(kinds: tuple[str, ...] | list[str]) -> list[int]:
    """Indices of the first two layers of each kind (one where the model has only one), in model order."""
    seen: dict[str, list[int]] = {}
    for index, kind in enumerate(kinds):
        if len(seen.setdefault(kind, [])) < 2:
            seen[kind].append(index)
    return sorted(index for indices in seen.values() for index in indices)


def build_copy(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    precision: str,
    attention: str,
    checkpointing: bool,
    trainable: TrainableSpec | None = None,
    adapters: str = "",
) -> tuple[nn.Module, list[int], FakeTensorMode]:
    """A fake-tensor copy of the model keeping only the representative layers; returns it with their indices.

    ``trainable`` (not full): the copy is the model as trained, the adapter added by peft after checkpointing is
    enabled (as a training script does) and the freeze pattern applied (:mod:`tuner.profile.trainable`; a pattern
    naming only layers the copy lacks freezes nothing here). ``adapters=""`` casts every parameter to the training
    dtype, as DeepSpeed's engine does under ZeRO 0-2; ``fp32`` and ``zero3`` keep peft's fp32 adapters (ZeRO-3)."""
    keep = _representatives(kinds)
    built = keep[-1] + 1
    full = text_config(hf_config(config))
    overrides: dict[str, Any] = {"num_hidden_layers": built}
    for name, value in config.items():  # per-layer lists (layer_types...) follow the shorter model
        if isinstance(value, list) and len(value) == full.num_hidden_layers and name != "architectures":
            overrides[name] = value[:built]
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    adapted = trainable is not None and not trainable.is_full
    try:
        if adapted:  # peft builds its layers on meta, not in fake mode: given fake storage below
            with torch.device("meta"):
                model: Any = build(config, attention=attention, dtype=TORCH_DTYPES[precision], **overrides)
        else:
            with fake_mode:
                model = build(config, attention=attention, dtype=TORCH_DTYPES[precision], **overrides)
    except WorkloadError as error:
        if "aten." not in str(error):
            raise
        # initialisation reads a tensor's value (a vision tower's): built on meta, then given fake CPU storage
        with torch.device("meta"):
            model = build(config, attention=attention, dtype=TORCH_DTYPES[precision], **overrides)
        with fake_mode:
            model.to_empty(device="cpu")
    layers = decoder_layers(model)
    kept = nn.ModuleList([layers[i] for i in keep])
    replace_module(model, layers, kept)
    text = text_config(model.config)
    if len(keep) < built:
        _renumber(kept, keep)
        _subset_per_layer(text, keep, built)
    text.num_hidden_layers = len(keep)
    if checkpointing:
        enable_checkpointing(model)
    if adapted and trainable is not None:
        from tuner.profile.trainable import apply_trainable

        model = apply_trainable(model, trainable, strict=False)
        if not adapters:  # DeepSpeed's engine casts every parameter to the training dtype (ZeRO 0-2)
            model.to(TORCH_DTYPES[precision])
        with fake_mode:
            model.to_empty(device="cpu")
    return model, keep, fake_mode


def _renumber(kept: nn.ModuleList, keep: list[int]) -> None:
    """Each kept layer's modules take its new position as their layer index (caches are indexed by it)."""
    for position, index in enumerate(keep):
        for module in kept[position].modules():
            for attribute in ("layer_idx", "layer_id"):
                if getattr(module, attribute, None) == index and not isinstance(getattr(module, attribute), bool):
                    setattr(module, attribute, position)


def _subset_per_layer(config: Any, keep: list[int], built: int) -> None:
    """Per-layer lists of the config (``layer_types``...) follow the kept layers; lists of layer indices stay."""
    for name, value in list(vars(config).items()):
        if not isinstance(value, (list, tuple)) or len(value) != built or name == "architectures":
            continue
        if all(isinstance(item, int) for item in value) and list(value) == sorted(set(value)):
            continue  # indices of layers (mlp_only_layers...), read when the layers were built
        setattr(config, name, type(value)(value[i] for i in keep))
    derived = {}  # per-layer lists a property computes (Jamba's layers_block_type from periods and offsets)
    for name in dir(type(config)):
        if isinstance(getattr(type(config), name, None), property):
            try:
                value = getattr(config, name)
            except Exception:  # a property this config cannot answer
                continue
            if isinstance(value, (list, tuple)) and len(value) == built:
                derived[name] = type(value)(value[i] for i in keep)
    if derived:
        config.__class__ = type(type(config).__name__, (type(config),), derived)


def _parts(
    by_layer: dict[int, int], keep: list[int], kinds: tuple[str, ...] | list[str]
) -> tuple[int, int, dict[str, int]]:
    """(outside, first-layer extras, bytes per kind) from bytes per kept layer."""
    per_kind: dict[str, int] = {}
    first: dict[str, int] = {}
    for position, index in enumerate(keep):
        kind = kinds[index]
        saved = by_layer.get(position, 0)
        if kind in first:
            per_kind[kind] = saved
        else:
            first[kind] = saved
    extra = 0
    for kind, saved in first.items():
        if kind in per_kind:
            extra += saved - per_kind[kind]
        else:
            per_kind[kind] = saved
    return by_layer.get(OUTSIDE, 0), extra, per_kind


Parts = tuple[int, int, dict[str, int]]  # (outside, first-layer extras, bytes per kind)
PROBE_LENGTHS = (4, 8)  # a model saving more tensors at the second is recurrent: traced step by step
SHORT_LENGTHS = (8, 16, 24)  # recurrent models are traced at these and extrapolated where exactly linear


def _traced_parts(
    model: nn.Module,
    keep: list[int],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    fake_mode: FakeTensorMode,
    recurrent: list[bool],
) -> list[Parts]:
    """The parts at micro-batch 1, 2 and 3 for ``seq_len``.

    A recurrent model (Mamba, RWKV...: its layers run one step at a time, saving tensors at every step, so a trace
    costs time in proportion to the length) is traced at :data:`SHORT_LENGTHS` and extrapolated linearly, when
    every part is exactly linear through the three; else (quadratic attention beside the recurrence) it is traced
    at ``seq_len``. ``recurrent``: empty, or what the model without checkpointing showed (a checkpointed model
    saves only the layers' inputs, the same at every length), and filled on the first call.
    """

    def at(length: int) -> list[Parts]:
        return [_parts(saved_bytes_by_layer(model, batch, length, fake_mode), keep, kinds) for batch in (1, 2, 3)]

    if seq_len > SHORT_LENGTHS[-1]:
        if not recurrent:
            counts: list[int] = []
            for length in PROBE_LENGTHS:
                saved_bytes_by_layer(model, 1, length, fake_mode, counts)
            recurrent.append(counts[0] != counts[1])
        if recurrent[0]:
            short = [at(length) for length in SHORT_LENGTHS]
            extrapolated = _extrapolated(short, seq_len)
            if extrapolated is not None:
                return extrapolated
    return at(seq_len)


def _extrapolated(short: list[list[Parts]], seq_len: int) -> list[Parts] | None:
    """The parts at ``seq_len`` from those at :data:`SHORT_LENGTHS`, or None unless each is exactly linear."""
    first, second = SHORT_LENGTHS[:2]  # equally spaced
    step = second - first

    def line(a: int, b: int, c: int) -> int | None:
        if b - a != c - b or (b - a) * (seq_len - first) % step:
            return None
        return a + (b - a) * (seq_len - first) // step

    out: list[Parts] = []
    for one, two, three in zip(*short, strict=True):
        outside, extra = line(one[0], two[0], three[0]), line(one[1], two[1], three[1])
        kinds = {kind: line(one[2][kind], two[2][kind], three[2][kind]) for kind in one[2]}
        if outside is None or extra is None or any(value is None for value in kinds.values()):
            return None
        out.append((outside, extra, {kind: value for kind, value in kinds.items() if value is not None}))
    return out


def _reason(error: BaseException) -> str:
    """One line: the error's type and message (trimmed), and where in transformers or torch it was raised."""
    import traceback

    message = " ".join(str(error).split())[:240]
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "/tuner/" not in frame.filename]
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {message}{where}" if message else f"{type(error).__name__}{where}"


class _LinearSavingInput(torch.autograd.Function):
    """``F.linear`` as ZeRO-3 runs it (``deepspeed.runtime.zero.linear.LinearFunctionForZeroStage3``): the output
    ``input @ weight.T (+ bias)``, and ``input``, ``weight`` and ``bias`` saved for backward whatever needs a
    gradient."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
        ctx.save_for_backward(input, weight, bias)
        output = input.matmul(weight.t())
        return output + bias if bias is not None else output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # the trace runs forward only; kept for completeness
        input, weight, bias = ctx.saved_tensors
        grad_weight = grad.reshape(-1, grad.shape[-1]).t().matmul(input.reshape(-1, input.shape[-1]))
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if bias is not None else None
        return grad.matmul(weight), grad_weight, grad_bias


@contextlib.contextmanager
def zero3_linear() -> Iterator[None]:
    """``torch.nn.functional.linear`` replaced as ``deepspeed.zero.Init`` replaces it (``memory_efficient_linear``,
    on by default; DeepSpeed leaves it replaced after the model is built, for the whole run): its autograd function
    saves every Linear's input, also where the weight is frozen and plain torch saves none (a LoRA base's q, k, v,
    o, gate, up and down projections and its LM head)."""
    original = torch.nn.functional.linear
    torch.nn.functional.linear = _LinearSavingInput.apply
    try:
        yield
    finally:
        torch.nn.functional.linear = original


def trace_activations(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    precision: str,
    attention: str,
    checkpointing: Iterable[bool],
    trainable: TrainableSpec | None = None,
    adapters: str = "",
) -> dict[bool, ActivationProfile]:
    """The activation profile of the model for these settings and each ``checkpointing`` setting asked for, traced
    at micro-batch 1, 2 and 3 under fake tensors.

    With checkpointing the non-checkpointed layers are traced too (``recompute`` is the largest of them): that one
    trace also gives the profile without checkpointing, so asking for both costs two traces, not three.
    ``trainable``, ``adapters``: the model as trained (:func:`build_copy`): frozen weights save no input for their
    weight gradient; the LoRA A input and the dropout masks are saved. ``zero3``: as ZeRO-3 trains it, every
    Linear saving its input whether its weight trains or not (:func:`zero3_linear`).
    """
    wanted = sorted(set(checkpointing))
    traces: dict[bool, list[Parts]] = {}
    experts: dict[bool, str] = {}
    recurrent: list[bool] = []
    for ckpt in (False, True) if True in wanted else (False,):
        with quiet():
            model, keep, fake_mode = build_copy(config, kinds, precision, attention, ckpt, trainable, adapters)
        try:
            with quiet(), zero3_linear() if adapters == "zero3" else contextlib.nullcontext():
                traces[ckpt] = _traced_parts(model, keep, kinds, seq_len, fake_mode, recurrent)
        except WorkloadError:
            raise
        except Exception as error:
            raise WorkloadError(
                "model.model_type", f"{config['model_type']} cannot be traced under fake tensors: {_reason(error)}"
            ) from None
        experts[ckpt] = str(getattr(model.config, "_experts_implementation", None) or "none")
    return {
        ckpt: _activation_profile(traces, ckpt, seq_len, precision, attention, experts[ckpt], adapters)
        for ckpt in wanted
    }


def _activation_profile(
    traces: dict[bool, list[Parts]],
    checkpointing: bool,
    seq_len: int,
    precision: str,
    attention: str,
    experts: str,
    adapters: str,
) -> ActivationProfile:
    """The profile of one checkpointing setting from the traces at micro-batch 1, 2 and 3 (with checkpointing, the
    largest non-checkpointed layer is what a layer's recomputation holds)."""
    one, two, three = traces[checkpointing]
    layers = {kind: Linear.through(one[2][kind], two[2][kind], three[2][kind]) for kind in one[2]}
    recompute = Linear()
    if checkpointing:
        plain = traces[False]
        recompute = max(
            (Linear.through(*(trace[2][kind] for trace in plain)) for kind in plain[0][2]),
            key=lambda line: line.at(2),
        )
    return ActivationProfile(
        seq_len=seq_len,
        precision=precision,
        attention=attention,
        experts=experts,
        checkpointing=checkpointing,
        outside=Linear.through(one[0], two[0], three[0]),
        first_extra=Linear.through(one[1], two[1], three[1]),
        layers=layers,
        recompute=recompute,
        adapters=adapters,
    )


def measured_saved_bytes(
    config: dict[str, Any], micro_batch: int, seq_len: int, precision: str, attention: str | None, checkpointing: bool
) -> int:
    """Bytes the whole model really saves in one forward pass on CPU (real tensors, random weights): the reference
    the traced profile is checked against."""
    torch.manual_seed(0)
    with quiet():
        model = build(config, attention=attention, dtype=TORCH_DTYPES[precision])
    if checkpointing:
        enable_checkpointing(model)
    with quiet():
        return sum(saved_bytes_by_layer(model, micro_batch, seq_len).values())
