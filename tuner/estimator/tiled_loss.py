"""The tiled loss's moment in the forward phase: ALST's ``TiledFusedLogitsLoss`` computes logits, loss and their
backward shard by shard inside forward (``deepspeed/runtime/sequence_parallel/ulysses_sp.py``), so what backward
would hold for the LM head and the loss is held in forward, one shard at a time.

Taken apart with the counting allocator's live bytes at marks inside the shard function (``bench/sp_true_peak.py``,
tiny Qwen2 dense and MoE, 2 ranks, SP2, ZeRO 2 and 3; each probe reproduced its row's true peak to the byte):

* The peak is inside a shard's backward: three fp32 shard-logits tensors are alive (the log-softmax's output,
  ``nll_loss_backward``'s and ``_log_softmax_backward_data``'s), the 16-bit shard logits already freed
  (:func:`shard_workspace`).
* The LM head's weight gradient accumulates across the shards in a tensor of its own: DeepSpeed is told the
  gradient is not ready (``ds_grad_is_ready = False``) until the last shard, whose gradient hook copies it into a
  reduce bucket after that shard's peak (:func:`head_gradient`), at every ZeRO stage.
* Under ZeRO-3 no parameter is whole at that moment (all ``NOT_AVAILABLE``, persistent ones included): the whole
  parameters the forward phase holds for the layers' moments are apart from the loss's (:func:`whole_parameters_apart`).
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.settings import FP32, Settings
from tuner.estimator.terms import NOTHING, Contribution, detail, held
from tuner.workload import Workload


def shard_workspace(elem: int, shard_logits: int) -> int:
    """Bytes of one shard's logits workspace at its worst moment: the shard's logits and their fp32 copy and
    log-softmax in its forward (``(e + 8)`` per element), three fp32 tensors in its backward (12)."""
    return max(elem + 2 * FP32, 3 * FP32) * shard_logits


def head_gradient_bytes(workload: Workload, s: Settings, trains: tuple[bool, ...]) -> int:
    """Bytes of the LM head's weight gradient (``e·h·V``), accumulated across the loss's shards in forward, beside the
    shard's workspace; 0 without a tiled loss or when the head is frozen (a LoRA model's). ``trains``: which
    parameters train (the model as trained, :attr:`.TrainedParams.mask`; empty: all)."""
    model = workload.model
    if s.tiled_loss_shards <= 1 or model.is_bare or not _head_trains(model.tie_embeddings, trains):
        return 0
    return s.param_bytes * model.vocab_size * model.hidden_size


def head_gradient(head: int) -> Contribution:
    """The tiled loss's head gradient of ``head`` bytes (:func:`head_gradient_bytes`) in the forward phase."""
    if not head:
        return NOTHING
    return detail("tiled_loss_head_grad", head) + held("gpu", "gradients", head, ("forward",))


def _head_trains(tied: bool, trains: tuple[bool, ...]) -> bool:
    """Whether the LM head trains: its weight is the model's last parameter, or its first when ``tied`` to the
    embedding (transformers' order)."""
    if not trains:
        return True
    return trains[0] if tied else trains[-1]


def whole_parameters_apart(s: Settings, details: Mapping[str, int], margin: int) -> Contribution:
    """ZeRO-3 under the tiled loss: take the whole parameters (persistent, kept gathered, the working set being
    gathered, as ``details`` recorded them) off the forward phase as far as the loss's moment, which holds none of
    them, sets the phase.

    ``margin``: how far the loss's moment (saved activations, shard workspace, head gradient) is above the forward
    phase's other moments (a layer's, which holds the whole parameters). The phase becomes the larger of the loss's
    moment alone and the other moment with the parameters.
    """
    if s.stage != 3 or s.tiled_loss_shards <= 1 or "gathered_parameters" not in details or margin <= 0:
        return NOTHING
    gathering = details.get("stage3_working_set", 0) + details.get("qwz_staging", 0)
    whole = details["gathered_parameters"] + s.param_bytes * details.get("persistent_elements", 0)
    from_buffers = min(gathering, margin)
    from_parameters = min(whole, margin - from_buffers)
    forward = ("forward",)
    out = held("gpu", "buffers", -from_buffers, forward) + held("gpu", "parameters", -from_parameters, forward)
    if from_buffers + from_parameters:
        out += detail("tiled_loss_whole_parameters_apart", from_buffers + from_parameters)
    return out


__all__ = ["head_gradient", "head_gradient_bytes", "shard_workspace", "whole_parameters_apart"]
