"""An instrument independent of the tracer: the bytes autograd really saves for backward in one training call.

Runs the real model on real CPU tensors under ``saved_tensors_hooks``, and counts each saved storage once (parameters
and buffers excluded, only storages still alive when the forward pass ends). It shares no code with
:mod:`tuner.profile.trace`, so the traced profiles, the coverage bench and the accuracy tests are checked against it
rather than against themselves. A test instrument, not product code: tests import it by name (``from saved_bytes
import saved_bytes``, pytest's ``pythonpath``), benches after adding ``tests/`` to ``sys.path``.
"""

from __future__ import annotations

import weakref

import torch


def saved_bytes(model: torch.nn.Module, tokens: torch.Tensor) -> int:
    """Bytes saved for backward by ``model(input_ids=tokens, labels=tokens)`` (a transformers causal LM, in training
    mode), then runs the backward pass so the graph is freed."""
    excluded = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    records: list[tuple[weakref.ref[torch.UntypedStorage], int, int]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        records.append((weakref.ref(storage), storage._cdata, storage.nbytes()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=tokens, labels=tokens).loss
    alive: dict[int, int] = {}
    for ref, key, nbytes in records:
        if ref() is not None and key not in excluded:
            alive.setdefault(key, nbytes)
    loss.backward()
    return sum(alive.values())
