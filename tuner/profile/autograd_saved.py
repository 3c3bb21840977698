"""What autograd saves in one forward pass of a transformers model, counted by decoder layer
(:func:`saved_bytes_by_layer`), under fake tensors or on real CPU tensors (fake and real are byte-equal), and
``F.linear`` as ZeRO-3 runs it (:func:`zero3_linear`). Imports torch and transformers.

A ``saved_tensors_hooks`` pack hook records each tensor autograd saves, with the decoder layer running at the time;
after the forward pass every storage still alive is counted once (parameters and buffers excluded), and with them
the states each layer leaves held in its caches and modules (:func:`_held`). No attention mask is passed (an all-ones
mask would be materialised); transformers looks for packed sequences in the position ids and, unable to read fake
values, would build a causal mask and lose grouped-query SDPA: the count tells it there are none, as for the real
unpacked batches, and reads a padding mask the model makes itself as none (:func:`fake_safe`). PyTorch's fake
``grouped_mm`` accepts only bf16 (the CPU kernel also runs fp32): other precisions run a stand-in saving what the
kernel saves (:class:`_GroupedMM`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers.masking_utils
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from tuner.profile.model_parts import decoder_layers, layer_runs, parallel_layer_lists, text_config
from tuner.workload import WorkloadError

OUTSIDE = -1


def _storage_id(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


@contextlib.contextmanager
def _marked_layers(
    model: nn.Module,
    state: dict[str, int],
    on_leave: Callable[[int, nn.Module, Any], None] | None = None,
) -> Iterator[None]:
    """While inside, ``state["layer"]`` is the index of the decoder layer running (``OUTSIDE`` between layers);
    ``on_leave(index, layer, arguments)`` is called as each layer returns (its positional and keyword arguments).

    Module hooks run outside transformers' gradient checkpointing (it checkpoints ``forward``), so the inputs it
    saves count as that layer's. A layer split over parallel lists (:func:`parallel_layer_lists`: XLM's) is layer
    ``i`` from the start of its first part to the start of layer ``i + 1``'s, the last one until the module holding
    the lists returns: the dropout and masking between its parts are its own. A layer may run as often as
    :func:`layer_runs` says (Dory's looped block), what each run saves counting for it; one entered more often
    (layers shared or looped in a way the config does not say) is refused (:class:`WorkloadError`): the per-kind
    extrapolation would not hold.
    """
    layers = decoder_layers(model)
    runs = layer_runs(text_config(model.config), len(layers))
    body, lists = parallel_layer_lists(model, layers)
    split = len(lists) > 1
    handles, entered = [], [0] * len(layers)

    def enter(index: int) -> None:
        entered[index] += 1
        if entered[index] > runs[index]:
            raise WorkloadError(
                "model.model_type",
                f"decoder layer {index} runs more often per forward pass than its config says (shared or looped "
                "layers): dstune's per-layer trace cannot count it",
            )
        state["layer"] = index

    def leave(index: int, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not split:
            state["layer"] = OUTSIDE
        if on_leave is not None:
            on_leave(index, module, (*args, *kwargs.values()))

    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=index: enter(i)))
        handles.append(
            layer.register_forward_hook(
                lambda m, a, k, o, i=index: leave(i, m, a, k), with_kwargs=True, always_call=True
            )
        )
        for other in lists:  # XLM's ffns[i], layer_norm2[i]...: still layer i
            if other is not layers:
                handles.append(other[index].register_forward_pre_hook(lambda m, a, i=index: state.update(layer=i)))
    if split:
        handles.append(body.register_forward_hook(lambda m, a, o: state.update(layer=OUTSIDE), always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def tensors_in(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in ``value``: itself, in lists, tuples and dicts, and in the attributes of a transformers object (a
    cache and its layers)."""
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth + 1)
    elif type(value).__module__.startswith("transformers.") and hasattr(value, "__dict__"):
        for item in vars(value).values():
            yield from tensors_in(item, depth + 1)


def _held(layer: nn.Module, arguments: Any, index: int | None = None) -> Iterator[torch.Tensor]:
    """What a decoder layer leaves held when it returns: the tensors of the caches it was given (a model called
    with ``use_cache=True``, its config's default in a training call, keeps K/V, recurrent and convolution states
    there: MiniMax's, OLMo-hybrid's, Qwen3.5's), of a cache's per-layer lists only the item of layer ``index``
    (a cache may make every layer's entry up front: Gemma-2's), and its modules' plain tensor attributes
    (RecurrentGemma's states)."""
    from transformers.cache_utils import Cache

    for argument in arguments:
        if isinstance(argument, Cache):
            for value in vars(argument).values():
                per_layer = index is not None and isinstance(value, (list, tuple)) and index < len(value)
                yield from tensors_in(value[index] if per_layer else value)
    for module in layer.modules():
        yield from (value for value in vars(module).values() if isinstance(value, torch.Tensor))


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


_preprocess_mask_arguments = transformers.masking_utils._preprocess_mask_arguments


def _unpadded_mask_arguments(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``_preprocess_mask_arguments``, a 2D padding mask on fake tensors read as no padding (None):
    the one a model makes itself when called without one (BART's decoder: ``torch.ones(batch, length)``), all
    ones for real, lets SDPA run ``is_causal`` without a mask; on fake tensors its values are unreadable
    (``is_tracing``) and a 4D mask would be built and saved by every layer."""
    early, mask, *rest = _preprocess_mask_arguments(*args, **kwargs)
    if not early and isinstance(mask, torch.Tensor) and mask.ndim == 2 and is_fake(mask):
        mask = None
    return (early, mask, *rest)


_tensor_deepcopy = torch.Tensor.__deepcopy__


def _deepcopy_fake_aware(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
    """``Tensor.__deepcopy__`` that copies a fake tensor as a new fake tensor of the same shape and dtype: torch's own
    copies the storage through a real one and fails (a model that deep-copies its cache layers in forward: Dory), and
    the failed op can leave the heap corrupt (the process aborted at exit)."""
    if not is_fake(self):
        return _tensor_deepcopy(self, memo)
    if id(self) not in memo:
        memo[id(self)] = self.detach().clone().requires_grad_(self.requires_grad)
    return memo[id(self)]


@contextlib.contextmanager
def fake_safe(model: nn.Module) -> Iterator[None]:
    """transformers sees no packed sequences and no padding (what it finds for real unpacked batches, unreadable on
    fake ones: :func:`_unpadded_mask_arguments`), fake tensors deep-copy as fake tensors
    (:func:`_deepcopy_fake_aware`) and, outside bf16, ``grouped_mm`` is :class:`_GroupedMM` (fake ``grouped_mm`` is
    bf16-only; the CPU kernel runs fp32 too)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch.Tensor, "__deepcopy__", _deepcopy_fake_aware))
        stack.enter_context(_patched(transformers.masking_utils, "find_packed_sequence_indices", lambda ids: None))
        stack.enter_context(
            _patched(transformers.masking_utils, "_preprocess_mask_arguments", _unpadded_mask_arguments)
        )
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
    counts once, for the first layer that saved it, if still alive after the forward pass; then, the same way,
    those a layer leaves held in the caches it was given and its modules' attributes (:func:`_held`: alive while
    the loop holds the output, at the loss, where activations peak). ``counted`` (if given) gets the number of
    tensors saved.
    """
    excluded = {_storage_id(t) for t in (*model.parameters(), *model.buffers())}
    state = {"layer": OUTSIDE}
    records: list[tuple[weakref.ref, int, int, int]] = []
    held: list[tuple[weakref.ref, int, int, int]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        records.append((weakref.ref(storage), storage._cdata, storage.nbytes(), state["layer"]))
        return tensor

    def leave(index: int, layer: nn.Module, arguments: Any) -> None:
        for tensor in _held(layer, arguments, index):
            storage = tensor.untyped_storage()
            held.append((weakref.ref(storage), storage._cdata, storage.nbytes(), index))

    model.train()
    with fake_mode or contextlib.nullcontext():
        tokens = torch.randint(0, text_config(model.config).vocab_size, (micro_batch, seq_len))
        with (
            fake_safe(model) if fake_mode is not None else contextlib.nullcontext(),
            _marked_layers(model, state, leave),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            output = model(input_ids=tokens, labels=tokens)  # as a training loop calls it: the config's use_cache
        for tensor in _held(model, output.values()):  # the rest, held outside the layers
            storage = tensor.untyped_storage()
            held.append((weakref.ref(storage), storage._cdata, storage.nbytes(), OUTSIDE))
        if counted is not None:
            counted.append(len(records))
        owner: dict[int, tuple[int, int]] = {}
        for ref, storage_id, nbytes, layer in (*records, *held):  # saved first, then held by caches and modules
            if ref() is not None and storage_id not in excluded and storage_id not in owner:
                owner[storage_id] = (layer, nbytes)
        records.clear()
        held.clear()
        del output  # no backward: what is counted is what the forward pass saved (backward was 2/3 of a trace's time)
    totals: dict[int, int] = {}
    for layer, nbytes in owner.values():
        totals[layer] = totals.get(layer, 0) + nbytes
    return totals


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
