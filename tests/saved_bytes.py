"""An instrument independent of the tracer: the bytes autograd really saves for backward in one training call, and
the states the call leaves held (a cache's, a module's).

Runs the real model on real CPU tensors under ``saved_tensors_hooks``, and counts each saved storage once (parameters
and buffers excluded, only storages still alive when the forward pass ends). Added to them, once each: the storages
the output's cache objects hold (a model called with ``use_cache=True``, its config's default, keeps recurrent and
convolution states there: MiniMax's, OLMo-hybrid's, Qwen3.5's linear attention) and the plain tensors modules hold as
attributes (RecurrentGemma's recurrent and convolution states), alive while the training loop holds the output, at
the loss, where the activations peak. It shares no code with :mod:`tuner.profile.trace`, so the traced profiles, the
coverage bench and the accuracy tests are checked against it rather than against themselves. A test instrument, not
product code: tests import it by name (``from saved_bytes import saved_bytes``, pytest's ``pythonpath``), benches
after adding ``tests/`` to ``sys.path``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in ``value``: itself, in lists, tuples and dicts, and in a cache object's attributes."""
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth + 1)
    elif type(value).__module__.startswith("transformers.") and hasattr(value, "__dict__"):
        for item in vars(value).values():
            yield from _tensors(item, depth + 1)


def held_bytes(model: torch.nn.Module, output: Any, counted: set[int]) -> int:
    """Bytes of the storages, not in ``counted``, that the output's caches and the modules' tensor attributes hold."""
    from transformers.cache_utils import Cache

    caches = [value for value in output.values() if isinstance(value, Cache)]
    states = [value for module in model.modules() for value in vars(module).values() if isinstance(value, torch.Tensor)]
    held: dict[int, int] = {}
    for tensor in (*(t for cache in caches for t in _tensors(cache)), *states):
        storage = tensor.untyped_storage()
        if storage._cdata not in counted:
            held.setdefault(storage._cdata, storage.nbytes())
    return sum(held.values())


def saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes saved for backward by ``model(input_ids=tokens, labels=tokens)`` (a transformers causal LM, in training
    mode) and held by its caches and modules' states (:func:`held_bytes`), then runs the backward pass so the graph
    is freed."""
    excluded = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    records: list[tuple[weakref.ref[torch.UntypedStorage], int, int]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        records.append((weakref.ref(storage), storage._cdata, storage.nbytes()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(input_ids=tokens, labels=tokens)
    alive: dict[int, int] = {}
    for ref, key, nbytes in records:
        if ref() is not None and key not in excluded:
            alive.setdefault(key, nbytes)
    held = held_bytes(model, output, {*alive, *excluded})
    loss = output.loss
    del output
    loss.backward()
    return sum(alive.values()) + held
