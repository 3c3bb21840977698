"""ZeRO-3's moments at the start of backward, while every parameter the forward pass kept gathered is still whole.

With a complete module trace DeepSpeed 0.19.8 keeps gathered after forward the parameters it reuses within
``stage3_max_reuse_distance`` (:func:`tuner.estimator.states.stage3_gathered.kept_after_forward`) and releases each
module's after that module's backward (``PartitionedParameterCoordinator.release_sub_module``): at backward's start
all of them are alive beside the saved activations. Two moments there can set the peak when the loss's workspace is
small (short sequences):

* the LM head's backward (``LinearFunctionForZeroStage3.backward``): the loss's fp32 log-softmax is freed, the
  logits' gradient in the training dtype (``e·b·s·V``) is alive, and the head makes its weight gradient (``e·V·h``)
  and its input's (``e·b·s·h``) (:func:`head_backward_bytes`);
* with optimizer offload, the first reduction (the last parameters' bucket, reduced when the next gradient would
  overflow it, the head's own module released by then): the bucket's gradients beside the reduce-scatter's staging
  or, in ``partition_grads`` → ``_offload_grad_partition_at_boundary``, the fp64 copy ``_constant_buffered_norm2``
  makes of each gradient partition for its norm (``get_norm_dtype``: ``8·⌈n/world⌉`` for the largest one)
  (:func:`first_offload_reduction_bytes`).

Measured on 2 CPU ranks with the counting allocator (``bench/precision_true_peak.py``, a 4-layer LLaMA at seq 32,
hidden 256, vocabulary 4,096, 500,000-element buckets; module hooks marking each module's backward): the device row
peaks inside the LM head's backward at 41,763,805 bytes (this moment: 41,676,748), the offload row at the head's
reduction, in the norm's fp64 copy, at 59,214,941 bytes (this moment: 59,230,924).
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.activations.plain_loss import PLAIN_LOSS_FAMILIES
from tuner.estimator.layouts.ulysses import local_seq
from tuner.estimator.settings import Settings
from tuner.estimator.states.partitions import stage3_layout
from tuner.estimator.states.stage3_gathered import kept_after_forward
from tuner.estimator.states.trainable import TrainedParams
from tuner.estimator.states.transients import NORM_BYTES, bucket_chunks
from tuner.workload import Workload

FP32 = 4


def head_backward_bytes(kept: int, saved: int, loss_saved: int, elem: int, tokens: int, vocab: int, hidden: int) -> int:
    """Bytes beyond the model states in the LM head's backward: the parameters kept gathered (``kept`` bytes), the
    saved activations (``saved`` bytes) less what the loss saved (``loss_saved``: freed by its backward), the logits'
    gradient and the head's weight and input gradients (``tokens`` = b·s).

    >>> head_backward_bytes(100, 50, 8, 2, 1, 4, 3)  # 100 + 42 + 2·4 + 2·12 + 2·3
    180
    """
    return kept + saved - loss_saved + elem * (tokens * vocab + vocab * hidden + tokens * hidden)


def first_offload_reduction_bytes(
    kept_after: int, saved: int, loss_saved: int, elem: int, first: tuple[int, ...], world: int
) -> int:
    """Bytes beyond the model states at ZeRO-3's first reduction with optimizer offload: the parameters still kept
    gathered (``kept_after`` bytes), the saved activations less the loss's, the first bucket's gradients (``first``:
    their elements) and the larger of its reduce-scatter staging (each padded to a multiple of ``world``) and the fp64
    copy of its largest gradient partition.

    >>> first_offload_reduction_bytes(60, 50, 8, 2, (100,), 2)  # 60 + 42 + 2·100 + max(2·100, 8·50)
    702
    """
    staging = elem * sum(-(-numel // world) * world for numel in first)
    norm = NORM_BYTES * max((-(-numel // world) for numel in first), default=0)
    return kept_after + saved - loss_saved + elem * sum(first) + max(staging, norm)


def loss_saved_bytes(elem: int, tokens: int, vocab: int, plain: bool, autocast: bool) -> int:
    """What the loss saves for its backward: the log-softmax of the logits, fp32 in Hugging Face's loss (it upcasts
    the logits) and under autocast, else in the logits' dtype (:mod:`.plain_loss`).

    >>> loss_saved_bytes(2, 3, 10, False, False), loss_saved_bytes(2, 3, 10, True, False)
    (120, 60)
    """
    return (elem if plain and not autocast else FP32) * tokens * vocab


def stage3_start_extra(
    workload: Workload, s: Settings, params: TrainedParams, saved: int, recorded: Mapping[str, int]
) -> int:
    """What ZeRO-3's start of backward holds beyond the backward phase (its reduction's copy, which comes later): the
    larger of the head's backward and, with optimizer offload, the first reduction; 0 where forward keeps nothing
    gathered, and where this is not modelled (a peft adapter, tensor parallelism, activation checkpointing, a loss
    other than Hugging Face's or the plain one: chunked, Liger, tiled)."""
    kept = recorded.get("gathered_parameters", 0)
    other_loss = s.chunked_loss or s.liger or s.tiled_loss_shards > 1
    if s.stage != 3 or not kept or not params.is_full or s.ranks.tensor > 1 or s.activation_checkpointing or other_loss:
        return 0
    model, elem = workload.model, s.param_bytes
    tokens = s.micro_batch * local_seq(workload, s)
    plain = model.family in PLAIN_LOSS_FAMILIES
    lost = loss_saved_bytes(elem, tokens, model.vocab_size, plain, bool(s.autocast))
    moment = head_backward_bytes(kept, saved, lost, elem, tokens, model.vocab_size, model.hidden_size)
    chunks = bucket_chunks(params.trainable, s.reduce_bucket_size)
    if s.offload_optimizer != "none" and len(chunks) > 1:
        first = _first_bucket(params.trainable, chunks[0])
        released = elem * _kept_of_last(workload, s, params, len(first))
        reduction = first_offload_reduction_bytes(kept - released, saved, lost, elem, first, s.zero_ranks)
        moment = max(moment, reduction)
    return max(0, moment - recorded.get("reduce_copy", 0))


def _first_bucket(numels: tuple[int, ...], first: int) -> tuple[int, ...]:
    """The elements of each parameter in the first bucket backward reduces (the last ``first`` elements)."""
    out: list[int] = []
    for numel in reversed(numels):
        if sum(out) >= first:
            break
        out.append(numel)
    return tuple(out)


def _kept_of_last(workload: Workload, s: Settings, params: TrainedParams, count: int) -> int:
    """Elements of the last ``count`` parameters that forward kept gathered (released after their modules' backward,
    before the first reduction)."""
    _, persists = stage3_layout(
        params.numels, s.zero_ranks, s.param_persistence_threshold, s.model_persistence_threshold
    )
    tied = workload.model.tie_embeddings
    cut = len(persists) - count
    kept_all = kept_after_forward(params.numels, persists, s.max_reuse_distance, tied)
    rest = tuple(persist or index >= cut for index, persist in enumerate(persists))
    return kept_all - kept_after_forward(params.numels, rest, s.max_reuse_distance, tied)
