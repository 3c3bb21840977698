"""The parameters of the model as trained, split into trainable and frozen, as DeepSpeed 0.19.8 holds them.

Measured on 2 CPU ranks (gloo, bf16; a tiny LLaMA-style model and a tiny Mixtral-shaped MoE with LoRA r=8 on
q_proj and v_proj, the adapter added by peft after the base is built, outside ``zero.Init`` as the HF Trainer adds
it, only the trainable parameters given to the optimizer; ``bench/peft_memory.py``, counting the engine's and the
optimizer's live storages) and read in DeepSpeed's code:

* Frozen parameters get no gradient, no fp32 master and no optimizer state at any stage: the optimizer's groups,
  ZeRO-1/2's flat 16-bit groups and ZeRO-3's gradient partition and fp32 partitions hold the trainable ones only.
* ZeRO-0: every parameter (frozen too) is cast to the training dtype by the engine
  (``_cast_module_mixed_precision``: peft's fp32 adapters become bf16); fp32 master + Adam: ``12·T``.
* ZeRO-1/2: frozen weights stay outside the flat groups, whole on every rank, in the training dtype (replicated:
  ``e·(Ψ - T)`` per rank); the flat 16-bit buffer, its partitions, gradients and optimizer states cover the
  trainable ``T`` elements as they would a model of ``T`` parameters.
* ZeRO-3: every parameter is partitioned, frozen ones included (``zero.Init`` built the base; the engine converts
  the adapters peft added afterwards, ``_convert_to_zero_parameters``), and parameters of at most
  ``stage3_param_persistence_threshold`` elements stay whole on every rank whatever they are: with small adapters
  all of them persist. The engine does not cast a ``zero.Init`` model, so peft's adapters keep their fp32 (4 bytes
  per element in shards and persistent copies) while the base is bf16. The gradient partition and the reduce
  bucket are in the training dtype and cover the trainable shards only (the bucket is allocated at
  ``reduce_bucket_size`` whatever the trainable count: on a small model it is most of the peak, at stages 1-3).
* ``modules_to_save`` copies are ordinary trainable parameters beside the frozen original (twice the bytes of the
  module, the copy with gradients and optimizer states), partitioned under ZeRO-3 like the rest.

Full fine-tuning takes the model's own numbers, so its estimates are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tuner.estimator.memo import per_workload
from tuner.estimator.settings import FP32
from tuner.estimator.states.partitions import stage3_layout
from tuner.workload import Workload, WorkloadError


@dataclass(frozen=True)
class TrainedParams:
    """Element counts of the model as trained.

    ``numels``: every parameter in model order (ZeRO-3 partitions them all); ``trainable``: the elements of each
    trainable parameter in order (the optimizer's, ZeRO-1/2's flat groups); ``mask``: which of ``numels`` train
    (empty: all); ``fp32``: which of ``numels`` are fp32 trainable parameters peft added beside a 16-bit base
    (empty: none); ``quantized``: which of ``numels`` are 4-bit bitsandbytes weights (empty: none;
    :mod:`.quantized`).
    """

    numels: tuple[int, ...]
    trainable: tuple[int, ...]
    largest_trainable: int
    mask: tuple[bool, ...] = ()
    fp32: tuple[bool, ...] = ()
    quantized: tuple[bool, ...] = ()

    @property
    def is_full(self) -> bool:
        """True when every parameter trains."""
        return not self.mask

    @cached_property
    def n_params(self) -> int:
        """All elements."""
        return sum(self.numels)

    @cached_property
    def n_trainable(self) -> int:
        """Trainable elements."""
        return sum(self.trainable)

    @cached_property
    def n_frozen(self) -> int:
        """Frozen elements."""
        return self.n_params - self.n_trainable


@per_workload
def trained_params(workload: Workload) -> TrainedParams:
    """The workload's parameters as trained: the model's own for full fine-tuning, else from the profile of the
    model as trained (:mod:`tuner.profile`), which an adapter or a freeze pattern needs (once per workload)."""
    model = workload.model
    if workload.trainable.is_full:
        return TrainedParams(model.param_numels, model.param_numels, model.largest_param)
    profile = workload.profile
    if profile is None or not profile.trainable:
        field = "peft" if workload.trainable.peft else "freeze"
        raise WorkloadError(field, "needs the profile of the model as trained (a transformers model config)")
    numels, mask = profile.param_numels, profile.trainable
    trainable = tuple(n for n, train in zip(numels, mask, strict=True) if train)
    fp32 = tuple(
        train and dtype == "fp32" for train, dtype in zip(mask, profile.param_dtypes or ("",) * len(mask), strict=True)
    )
    quantized = profile.quantized if workload.trainable.quantization else ()
    return TrainedParams(numels, trainable, max(trainable), mask, fp32 if any(fp32) else (), quantized)


@dataclass(frozen=True)
class Stage3Bytes:
    """ZeRO-3 per rank with frozen parameters: parameter bytes in shards and whole persistent copies (fp32
    adapters at 4 bytes), and the trainable shard's elements (gradients, masters, optimizer states)."""

    shard_bytes: int
    persistent_bytes: int
    trainable_shard: int


def stage3_bytes(
    params: TrainedParams, world_size: int, elem: int, persistence_threshold: int, model_persistence_threshold: int
) -> Stage3Bytes:
    """Per-rank ZeRO-3 bytes of ``params``, laid out as :func:`tuner.estimator.states.partitions.stage3_layout` says."""
    parts, persists = stage3_layout(params.numels, world_size, persistence_threshold, model_persistence_threshold)
    fp32 = params.fp32 or (False,) * len(params.numels)
    mask = params.mask or (True,) * len(params.numels)
    shard = persistent = trainable_shard = 0
    for numel, part, keep, upcast, train in zip(params.numels, parts, persists, fp32, mask, strict=True):
        size = FP32 if upcast else elem
        shard += size * part
        trainable_shard += part if train else 0
        persistent += size * numel if keep else 0
    return Stage3Bytes(shard, persistent, trainable_shard)


def frozen_lead(params: TrainedParams, persists: tuple[bool, ...]) -> int:
    """Elements of the gathered (not persistent) parameters before the first trainable one, in model order, when
    they are frozen: the input embedding and the first layer's first projections of a LoRA model. Their outputs
    need no gradient (frozen weights over token ids), so backward never runs their modules and ZeRO-3 does not keep
    them gathered for it (measured: a tiny LLaMA's frozen embedding is released after the forward pass).

    >>> frozen_lead(TrainedParams((8, 2, 8), (2,), 2, (False, True, False)), (False, True, False))
    8
    >>> frozen_lead(TrainedParams((8, 2), (8, 2), 8), (False, True))
    0
    """
    if params.is_full:
        return 0
    lead = 0
    for numel, train, persist in zip(params.numels, params.mask, persists, strict=True):
        if train:
            break
        lead += 0 if persist else numel
    return lead
