"""Step 0's dropout held (:mod:`tuner.measure.rank.dropout_hold`): the same global batch split into other
micro-batches gives the same gradient, with the same tensors saved for backward as dropout at its own probability."""

from __future__ import annotations

import torch
from torch import nn

from tuner.measure.rank.dropout_hold import HELD_P, DropoutHold


class Attention(nn.Module):
    """A transformers-style attention: its dropout a float it hands to SDPA while training."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.attention_dropout = 0.1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).unsqueeze(1)
        dropout = self.attention_dropout if self.training else 0.0
        return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=dropout).squeeze(1)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.05), Attention(32), nn.Dropout(0.0), nn.Linear(32, 1))


def gradient(net: nn.Module, batch: torch.Tensor, micro: int, hold: bool) -> torch.Tensor:
    """The gradient of the batch's mean output, accumulated over micro-batches of ``micro`` samples."""
    net.zero_grad()
    torch.manual_seed(1)
    holder = DropoutHold()
    if hold:
        holder.hold(net)
    for part in batch.split(micro):
        (net(part).sum() / len(batch)).backward()
    holder.release()
    return torch.cat([p.grad.flatten() for p in net.parameters()])


def test_with_dropout_held_two_splits_of_one_batch_give_one_gradient() -> None:
    net, batch = model(), torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(gradient(net, batch, 8, hold=False), gradient(net, batch, 1, hold=False))
    whole, split = gradient(net, batch, 8, hold=True), gradient(net, batch, 1, hold=True)
    assert torch.allclose(whole, split, rtol=1e-5, atol=1e-7)
    net.eval()  # dropout off altogether: the held gradient is the deterministic one
    assert torch.allclose(whole, gradient(net, batch, 8, hold=False), rtol=1e-5, atol=1e-7)


def test_the_sites_are_held_then_given_back_and_zero_ones_left_alone() -> None:
    net = model()
    holder = DropoutHold()
    assert holder.hold(net) == 2  # the 0.05 module and the attention's float; the 0.0 module is no site
    assert net[1].p == HELD_P and net[2].attention_dropout == HELD_P and net[3].p == 0.0
    holder.release()
    assert net[1].p == 0.05 and net[2].attention_dropout == 0.1 and net[3].p == 0.0


def saved_bytes(net: nn.Module, batch: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one forward (parameters included: the same either way)."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        net(batch).sum()
    return sum(saved.values())


def test_held_dropout_saves_what_dropout_saves_unlike_dropout_at_zero() -> None:
    net, batch = model(), torch.randn(8, 4, 16)
    dropping = saved_bytes(net, batch)
    holder = DropoutHold()
    holder.hold(net)
    held = saved_bytes(net, batch)
    holder.release()
    net[1].p, net[2].attention_dropout = 0.0, 0.0
    assert held == dropping > saved_bytes(net, batch)
