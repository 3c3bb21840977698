"""Moments the saved bytes miss, traced under fake tensors (imports torch and transformers): a decoder layer's worst
moment in its own backward pass, and what the model holds before its first layer runs.

What autograd saves (:mod:`tuner.profile.autograd_saved`) is what a layer holds when its backward starts; the
layer's worst moment comes later, part-way through it, with backward's temporaries beside what is left of its saved
tensors: a gated MLP's intermediate-wide gradients, or RMSNorm's gradient in fp32 (five fp32 ``[tokens, hidden]``
temporaries: measured under activation checkpointing at 8,192 tokens, ``bench/sp_true_peak.py``). With
checkpointing that moment, in the recomputed layer, sets the peak of a long sequence.

:func:`layer_backward_peaks` runs one layer alone, forward and backward, on the inputs it gets inside the model,
under a dispatch mode that sees every storage the layer allocates and, through weak references, when each is freed.
It answers two peaks of the live bytes over the layer's backward: over all of it, and outside its MLP block's own
backward with the MLP's tensors left out (what a layer holds when DeepSpeed's ``TiledMLP`` recomputes the MLP shard
by shard and keeps only its input). The layer's parameters, their gradients, its output and the gradient arriving
at it are not counted (they are the model states' and the next layer's); saved tensors made outside the layer
(rotary tables, masks) are, as the saved-bytes trace counts them.

:func:`pre_layer_bytes`: the model's forward pass up to its first decoder layer, with its worst moment and what it
holds into the layers beside their input: attention masks the model builds (Qwen2-MoE builds a sliding-window mask of
``s × s`` booleans for no layer, three such tensors at once while it does: measured under Ulysses at 4,096 tokens a
rank, 48 MiB).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from torch.utils._python_dispatch import TorchDispatchMode

from tuner.profile.autograd_saved import fake_safe, tensors_in
from tuner.profile.model_parts import decoder_layers, text_config

Event = tuple[bool, int, int, str]  # (allocated, serial, bytes, where: forward, mlp, backward, mlp_back or layer)


def _safe(model: nn.Module) -> Any:
    """:func:`fake_safe` for a fake-tensor copy; nothing for a real one."""
    return fake_safe(model) if is_fake(next(model.parameters())) else contextlib.nullcontext()


class _Stop(Exception):
    """Raised by a forward pre-hook once it has the layer's inputs: the rest of the model need not run."""


class _StorageEvents(TorchDispatchMode):
    """Every storage an op returns, once, as an allocation event, and its free when the storage dies; each storage
    gets a serial number (its address is reused once it is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.where = "forward"
        self.serials: dict[int, int] = {}  # storage address -> serial of the storage alive there

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tensors_in(out):
            storage = tensor.untyped_storage()
            if storage._cdata not in self.serials:
                serial = len(self.events)
                self.serials[storage._cdata] = serial
                self.events.append((True, serial, storage.nbytes(), self.where))
                weakref.finalize(storage, self._freed, storage._cdata, serial)
        return out

    def _freed(self, address: int, serial: int) -> None:
        if self.serials.get(address) == serial:
            del self.serials[address]
        self.events.append((False, serial, 0, self.where))

    def serial(self, tensor: torch.Tensor) -> int | None:
        """The serial of ``tensor``'s storage if it was made under this mode and is alive."""
        return self.serials.get(tensor.untyped_storage()._cdata)


def _layer_inputs(
    model: nn.Module, layer: nn.Module, micro_batch: int, seq_len: int, events: _StorageEvents | None = None
) -> tuple[list[Any], dict]:
    """The positional and keyword arguments ``layer`` gets in a training forward pass of ``model`` (run up to it
    under ``events`` if given)."""
    captured: dict[str, Any] = {}

    def grab(module: nn.Module, args: Any, kwargs: Any) -> None:
        captured.update(args=list(args), kwargs=dict(kwargs))
        if events is not None:
            events.where = "layer"  # what follows is the unwinding
        raise _Stop

    handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        tokens = torch.randint(0, text_config(model.config).vocab_size, (micro_batch, seq_len))
        with contextlib.suppress(_Stop), events or contextlib.nullcontext():
            model(input_ids=tokens, labels=tokens)
    finally:
        handle.remove()
    if "args" not in captured:
        raise RuntimeError("the layer did not run")
    return captured["args"], captured["kwargs"]


def _hidden_input(args: list[Any], kwargs: dict) -> torch.Tensor:
    """The layer's hidden-state input (its first tensor argument), replaced by a leaf that needs a gradient."""
    for container, key in [*((args, i) for i in range(len(args))), *((kwargs, k) for k in kwargs)]:
        value = container[key]  # type: ignore[index]
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim == 3:
            leaf = value.detach().requires_grad_()
            container[key] = leaf  # type: ignore[index]
            return leaf
    raise RuntimeError("no hidden-state input found")


def _run(layer: nn.Module, args: list[Any], kwargs: dict, events: _StorageEvents) -> tuple[set[int], int, int]:
    """Run ``layer`` forward and backward under ``events``; (storages not counted, saved bytes made outside the
    layer, index of backward's first event)."""
    outside: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in events.serials:  # made before the layer ran (or a parameter)
            outside.setdefault(storage._cdata, storage.nbytes())
        return tensor

    mlp = getattr(layer, "mlp", None)
    hooks = []
    if isinstance(mlp, nn.Module):

        def enter(where: str) -> Any:
            return lambda *_: setattr(events, "where", where)

        hooks = [
            mlp.register_forward_pre_hook(enter("mlp")),
            mlp.register_forward_hook(enter("forward")),
            mlp.register_full_backward_pre_hook(enter("mlp_back")),
            mlp.register_full_backward_hook(enter("backward")),
        ]
    try:
        with events, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = layer(*args, **kwargs)
        output = output[0] if isinstance(output, (tuple, list)) else output
        with events:
            grad = torch.ones_like(output)
            events.where, start = "backward", len(events.events)
            torch.autograd.backward(output, grad)
    finally:
        for hook in hooks:
            hook.remove()
    params = [*layer.parameters(), *layer.buffers()]
    kept = [output, grad, *params, *(p.grad for p in params if p.grad is not None)]
    ignored = {serial for serial in map(events.serial, kept) if serial is not None}
    excluded = {t.untyped_storage()._cdata for t in kept}
    external = sum(nbytes for key, nbytes in outside.items() if key not in excluded)
    return ignored, external, start


# the worst moment and its excess over backward's start; outside the MLP, the same; the MLP block's saved tensors
Peaks = tuple[int, int, int, int, int]


def layer_backward_peaks(model: nn.Module, index: int, micro_batch: int, seq_len: int) -> Peaks:
    """Decoder layer ``index``'s live bytes at the worst moment of its backward, and that moment's excess over what
    it held when its backward started (its saved tensors); the same two outside its MLP's backward, the MLP's
    tensors left out; and what its MLP block saved (made in the block's forward, alive when backward starts: what
    ``TiledMLP`` drops). Run on ``model`` (a fake-tensor copy, called inside its ``FakeTensorMode``)."""
    layer = decoder_layers(model)[index]
    model.train()
    with _safe(model):
        args, kwargs = _layer_inputs(model, layer, micro_batch, seq_len)
        _hidden_input(args, kwargs)
        events = _StorageEvents()
        ignored, external, start = _run(layer, args, kwargs, events)
    live: dict[int, tuple[int, bool]] = {}
    total = mlp_alive = peak = peak_outside = 0
    begin = begin_outside = -1
    for position, (allocated, key, nbytes, where) in enumerate(events.events):
        if position == start:
            begin, begin_outside = total, total - mlp_alive
        if key in ignored:
            continue
        if allocated:
            mlp = where in ("mlp", "mlp_back")
            live[key] = (nbytes, mlp)
            total += nbytes
            mlp_alive += nbytes if mlp else 0
        elif key in live:
            nbytes, mlp = live.pop(key)
            total -= nbytes
            mlp_alive -= nbytes if mlp else 0
        if position >= start:
            peak = max(peak, total)
            if where != "mlp_back":
                peak_outside = max(peak_outside, total - mlp_alive)
    if begin < 0:
        raise RuntimeError("the layer's backward allocated nothing")
    excess_outside = max(0, peak_outside - begin_outside)
    return peak + external, peak - begin, peak_outside + external, excess_outside, begin - begin_outside


def pre_layer_bytes(model: nn.Module, micro_batch: int, seq_len: int) -> tuple[int, int]:
    """(the worst moment's live bytes, the bytes still held when the first decoder layer starts, its hidden-state
    input left out) of ``model``'s training forward pass before that layer, parameters not counted; inside the
    model's ``FakeTensorMode``."""
    model.train()
    events = _StorageEvents()
    with _safe(model):
        args, kwargs = _layer_inputs(model, decoder_layers(model)[0], micro_batch, seq_len, events)
    kept = [*model.parameters(), *model.buffers(), _hidden_input(args, kwargs)]
    ignored = {serial for serial in map(events.serial, kept) if serial is not None}
    live: dict[int, int] = {}
    total = peak = 0
    for allocated, serial, nbytes, where in events.events:
        if where == "layer":
            break
        if serial in ignored:
            continue
        if allocated:
            live[serial] = nbytes
            total += nbytes
        else:
            total -= live.pop(serial, 0)
        peak = max(peak, total)
    return peak, total


def traced_pre_layer(model: nn.Module, seq_len: int, fake_mode: FakeTensorMode | None) -> list[tuple[int, int]] | None:
    """:func:`pre_layer_bytes` at micro-batch 1, 2 and 3; None where it cannot be traced (nothing is added then:
    the saved-bytes trace ran, and this extra count is no reason to refuse the model)."""
    try:
        with fake_mode or contextlib.nullcontext():
            return [pre_layer_bytes(model, batch, seq_len) for batch in (1, 2, 3)]
    except Exception:
        return None


def traced_backward_peaks(
    model: nn.Module, positions: list[int], seq_len: int, fake_mode: FakeTensorMode | None
) -> list[Peaks] | None:
    """:func:`layer_backward_peaks` at micro-batch 1, 2 and 3 for the layer (of those at ``positions``) with the
    largest peak, with the least any of them saved in its MLP block (what every layer's tiled MLP is taken to drop);
    None where a layer cannot run alone or backward fails under fake tensors (the estimate then keeps the saved
    bytes alone)."""
    try:
        with fake_mode or contextlib.nullcontext():
            by_layer = [[layer_backward_peaks(model, i, batch, seq_len) for batch in (1, 2, 3)] for i in positions]
    except Exception:  # a layer that cannot run alone: no backward trace, not a refusal of the model
        return None
    if not by_layer:
        return None
    worst = max(by_layer, key=lambda peaks: peaks[1][0])
    return [(*peaks[:4], min(layer[batch][4] for layer in by_layer)) for batch, peaks in enumerate(worst)]


__all__ = ["Peaks", "layer_backward_peaks", "pre_layer_bytes", "traced_backward_peaks", "traced_pre_layer"]
