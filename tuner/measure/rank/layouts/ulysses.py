"""Ulysses sequence parallelism on a rank, and the loss a long-context run trains on.

A trial with ``sequence_parallel_size`` sp > 1 (:attr:`TrialConfig.layout`) trains as DeepSpeed 0.19.8's ALST
tutorial does: :func:`join_sequence_parallel` registers ``UlyssesSPAttentionHF`` with transformers' attention (the
model's own kernel wrapped by the all-to-all) and returns the mpu that ``deepspeed.initialize`` takes. DeepSpeed
groups consecutive ranks: a rank's sp rank is ``rank % sp``, its data-parallel rank ``rank // sp``. Every rank of a
sequence-parallel group draws the group's sample (seeded by the data-parallel rank) and keeps its share of the
sequence (:func:`shard_batch`): input ids and the shifted labels (``shift_labels``, the last position ``-100``) of its
s/sp tokens, as ``UlyssesSPDataLoaderAdapter`` shards a batch, without the adapter's gathers: the seeded batch is
already the same on every rank of the group.

:class:`LongContextLM` computes each rank's summed loss over its tokens (logits in full, or in shards by
``TiledFusedLogitsLoss``) and reduces it over the group with a weighted all-reduce (losses and token counts summed;
gloo has no averaging all-reduce). The value is the group's mean loss, the same on every rank; the gradient it
backpropagates depends on the ZeRO stage, because DeepSpeed 0.19.8 reduces gradients differently under Ulysses:
ZeRO 0-2 sum the sequence-parallel ranks' gradients and average over the data-parallel ranks (they divide by
dp·sp/sp), ZeRO-3's reduce-scatter averages over all sp × dp ranks. So each rank backpropagates its own share of
the loss (``sum / tokens of the group``) under ZeRO 0-2 and sp times it under ZeRO-3 (what the tutorial's
differentiable all-gather of the losses amounts to): both give exactly the single-rank gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # transformers' label that no loss counts


@dataclass(frozen=True)
class SequenceShard:
    """Where a rank sits in the layout: its sequence-parallel group's size and its rank there, its data-parallel
    rank, the group and the mpu DeepSpeed takes (None without sequence parallelism)."""

    size: int = 1
    rank: int = 0
    dp_rank: int = 0
    group: Any = None
    mpu: Any = None

    def layout(self, data_parallel: int) -> dict[str, int]:
        """The rank's place, as its result reports it."""
        return {"sequence_parallel": self.size, "sp_rank": self.rank, "data_parallel": data_parallel,
                "dp_rank": self.dp_rank}  # fmt: skip


def join_sequence_parallel(hf_model: Any, sp: int, micro: int, seq_len: int, dp_rank: int) -> SequenceShard:
    """Register Ulysses with transformers for ``hf_model`` (its resolved attention kernel) and make DeepSpeed's
    sequence-parallel groups; a plain shard for ``sp`` 1. ``dp_rank``: the rank's data-parallel index
    (:meth:`tuner.workload.Ranks.place`). Call after ``init_distributed``."""
    if sp == 1:
        return SequenceShard(dp_rank=dp_rank)
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=hf_model,
        core_attn_implementation=hf_model.config._attn_implementation,
        sequence_parallel_size=sp,
        micro_batch_size=micro,
        seq_length=seq_len,
        seq_length_is_variable=False,
    )
    rank = mpu.get_sequence_parallel_rank()
    return SequenceShard(sp, rank, dp_rank, mpu.get_sequence_parallel_group(), mpu)


def shard_batch(tokens: torch.Tensor, shard: SequenceShard) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input ids and shifted labels of a (micro-batch, seq) token batch whose labels are the tokens."""
    labels = F.pad(tokens, (0, 1), value=IGNORE)[:, 1:]
    chunk = tokens.shape[1] // shard.size
    part = slice(chunk * shard.rank, chunk * (shard.rank + 1))
    return tokens[:, part].contiguous(), labels[:, part].contiguous()


class LongContextLM(nn.Module):
    """A transformers causal LM (``lm.model``) trained on a rank's share of the sequence; ``forward(tokens,
    labels)`` takes :func:`shard_batch`'s pair and returns the group's mean loss, whose gradient is the rank's
    share scaled as its ZeRO stage needs (module docstring).

    Args:
        lm: the :class:`~tuner.measure.rank.models.TransformersCausalLM` (its ``model`` is the transformers model or
            its peft wrapper).
        shard: the rank's place (:func:`join_sequence_parallel`).
        stage: the ZeRO stage (3 scales the backpropagated share by sp).
        loss_shards: > 1 computes logits and loss with ``TiledFusedLogitsLoss`` in this many shards.
        accumulation: the gradient accumulation steps (DeepSpeed divides the loss by them in ``backward``).
    """

    def __init__(self, lm: nn.Module, shard: SequenceShard, stage: int, loss_shards: int, accumulation: int) -> None:
        super().__init__()
        self.lm, self.shard, self.loss_shards, self.accumulation = lm, shard, loss_shards, accumulation
        self.gradient_scale = float(shard.size) if stage == 3 else 1.0

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        model: Any = self.lm.model
        batch, length = tokens.shape
        start = self.shard.rank * length
        positions = torch.arange(start, start + length, device=tokens.device).unsqueeze(0).expand(batch, -1)
        hidden = model.get_decoder()(input_ids=tokens, position_ids=positions, use_cache=False).last_hidden_state
        head = model.get_output_embeddings()
        count = self._group_sum(torch.stack([(labels != IGNORE).sum().to(torch.float32)]))[0]
        weight = self.gradient_scale / count
        if self.loss_shards > 1:
            own, local_sum = self._tiled(head, hidden, labels, weight)
        else:
            logits = head(hidden).float()
            local_sum = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), reduction="sum")
            own = local_sum * weight
        value = self._group_sum(local_sum.detach().reshape(1).to(torch.float32))[0] / count
        return own + (value - own).detach()  # the group's mean loss; the gradient of this rank's weighted share

    def _tiled(
        self, head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``TiledFusedLogitsLoss`` over ``loss_shards`` shards: (what to backpropagate, the summed loss).

        It backpropagates each shard inside forward with an incoming gradient of 1, so lm_head's gradient is made
        there: the weight (and DeepSpeed's later 1/accumulation) is applied inside each shard's loss, and the
        share handed to ``backward`` is multiplied by the accumulation steps so that the gradient reaching the
        function is 1 and the hidden states' gradient it kept is used as is.
        """
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

        scale = (weight / self.accumulation).detach()

        def shard_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = module(x).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum") * scale

        params = [param for param in head.parameters() if param.requires_grad]
        scaled = TiledFusedLogitsLoss.apply(shard_loss, head, hidden, labels, None, self.loss_shards, params, "sum")
        return scaled * self.accumulation, scaled.detach() / scale

    def _group_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the sequence-parallel group (as is without one)."""
        if self.shard.group is None:
            return values
        values = values.clone()
        dist.all_reduce(values, group=self.shard.group)
        return values


__all__ = ["LongContextLM", "SequenceShard", "join_sequence_parallel", "shard_batch"]
