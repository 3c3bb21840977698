"""ALST's memory pieces on a rank's transformers model: the tiled MLP and checkpoint offload.

* :func:`tile_mlps` (``dstune.tiled_mlp_shards`` > 1): each decoder layer's MLP runs through DeepSpeed 0.19.8's
  ``TiledMLP`` (``deepspeed.runtime.sequence_parallel.ulysses_sp``), the sequence in that many shards in forward,
  and again shard by shard in backward (its intermediate never exists whole). An MoE layer's block is tiled the
  same way (routing is per token, so the shards' outputs are the whole block's): ``TiledMLP``'s backward hands the
  block its shards flattened to ``[tokens, hidden]``, which transformers' MoE blocks cannot take, so each call gets
  the batch dimension back (:func:`_batch_major`).
* :func:`offload_checkpoints` (``dstune.offload_checkpoints``, CUDA only): the checkpointed layers keep their input
  (the hidden states between layers, what activation checkpointing saves) in pinned host memory instead of on the
  GPU, and recompute the layer from it in backward, as ALST's checkpoint offload does. transformers calls a
  layer's ``_gradient_checkpointing_func`` with the layer's forward and its hidden states; that function is replaced
  by :class:`OffloadedCheckpoint`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def decoder_layers(model: Any) -> list[nn.Module]:
    """The decoder layers of a transformers causal LM (or its peft wrapper)."""
    return list(model.get_decoder().layers)


def _batch_major(block: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``block`` taking ``[tokens, hidden]`` too, as ``[1, tokens, hidden]`` (a view: no bytes), as ``TiledMLP``'s
    backward calls it, and a shard of a micro-batch of several samples (not contiguous: ``TiledMLP``'s forward cuts
    the sequence dimension) made contiguous, since transformers' MoE blocks ``view`` it; its backward does the same
    (``reshape``)."""

    def run(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block(self, x.unsqueeze(0)).squeeze(0) if x.dim() == 2 else block(self, x.contiguous())

    return run


def tile_mlps(model: Any, shards: int) -> int:
    """Run every decoder layer's ``mlp`` (dense or mixture of experts) through ``TiledMLP`` in ``shards`` sequence
    shards; returns how many."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    tiled = 0
    for layer in decoder_layers(model):
        mlp = getattr(layer, "mlp", None)
        if mlp is None:
            continue
        dense = _batch_major(type(mlp).forward)
        params = [param for param in mlp.parameters() if param.requires_grad]

        def tiled_forward(self: nn.Module, x: torch.Tensor, _dense: Any = dense, _params: Any = params) -> Any:
            return TiledMLP.apply(_dense, self, x, shards, _params)

        mlp.forward = types.MethodType(tiled_forward, mlp)
        tiled += 1
    return tiled


class OffloadedCheckpoint(torch.autograd.Function):
    """Activation checkpointing of one layer whose saved input lives in pinned host memory.

    Forward copies the layer's input to a pinned host buffer and runs the layer without saving anything; backward
    brings the input back to the device, recomputes the layer with gradients and backpropagates through it.
    """

    @staticmethod
    def forward(ctx: Any, run: Callable[[torch.Tensor], Any], hidden: torch.Tensor) -> Any:
        host = torch.empty(hidden.shape, dtype=hidden.dtype, device="cpu", pin_memory=True)
        host.copy_(hidden, non_blocking=True)
        ctx.run, ctx.host, ctx.device, ctx.needs_grad = run, host, hidden.device, hidden.requires_grad
        with torch.no_grad():
            return run(hidden)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        hidden = ctx.host.to(ctx.device, non_blocking=True).detach().requires_grad_(ctx.needs_grad)
        ctx.host = None
        with torch.enable_grad():
            output = ctx.run(hidden)
        outputs = output if isinstance(output, tuple) else (output,)
        pairs = [
            (out, grad) for out, grad in zip(outputs, grads, strict=False) if grad is not None and out.requires_grad
        ]
        torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        return None, hidden.grad


def offloaded_checkpoint(run: Callable[..., Any], hidden: torch.Tensor, *rest: Any) -> Any:
    """What transformers calls in place of ``torch.utils.checkpoint.checkpoint`` for a checkpointed layer."""
    if rest:
        return OffloadedCheckpoint.apply(lambda x: run(x, *rest), hidden)
    return OffloadedCheckpoint.apply(run, hidden)


def offload_checkpoints(model: Any) -> int:
    """Make every checkpointed decoder layer keep its input in pinned host memory; returns how many layers.

    Raises:
        ValueError: (``dstune.offload_checkpoints``) no layer is checkpointed (activation checkpointing is off).
    """
    layers = [layer for layer in decoder_layers(model) if getattr(layer, "gradient_checkpointing", False)]
    if not layers:
        raise ValueError("dstune.offload_checkpoints: no decoder layer is checkpointed; turn checkpointing on")
    for layer in layers:
        setattr(layer, "_gradient_checkpointing_func", offloaded_checkpoint)  # noqa: B010 (a module attribute)
    return len(layers)


__all__ = ["OffloadedCheckpoint", "decoder_layers", "offload_checkpoints", "tile_mlps"]
