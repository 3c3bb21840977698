"""Transient buffers: what DeepSpeed 0.19 allocates for a moment inside a phase and frees before its end.

Phase snapshots (live storages when forward, backward and the step end) miss these; the allocator's records of a
real run show them (``tuner.measure.rank.true_peak``, ``live_at_peak``: which op allocated what, alive with what). Found
on 2 CPU ranks (Pythia-160M shape, fp32 and bf16) and confirmed in DeepSpeed's code:

* ZeRO-0 all-reduces gradients after backward through ``engine.allreduce_no_retain``: it flattens them into chunks
  (tensors added until a chunk holds more than ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8 elements, whatever the config's
  bucket sizes) with ``torch.cat``, all-reduces each chunk and copies it back: one chunk alive beside every
  gradient (:func:`zero0_allreduce_copy`).
* ZeRO-0 in 16-bit (``FP16_Optimizer``, bf16 too) flattens the gradients for its step from a list of
  ``p.grad.to(fp32)`` copies: every fp32 copy and the flat fp32 gradient are alive together, ``4Ψ`` beyond the
  step phase's fp32 gradients.
* ZeRO-1/2 with ``reduce_scatter`` (the default) reduce each filled gradient bucket through ``average_tensor`` →
  ``allreduce_and_scatter`` → ``allreduce_bucket``, which flattens the bucket's slices into a new tensor: one more
  copy of the bucket's contents beside the contiguous bucket. The first bucket is reduced before the rank's
  gradient partition exists (it is allocated at the first copy into it), later ones beside it
  (:func:`flat_reduce_copy`).
* ZeRO-3 reduce-scatters each filled bucket through ``reduce_scatter_coalesced``, which concatenates the bucket's
  gradients (padded) into one flat tensor (:func:`stage3_reduce_copy`). By the last reduction backward has
  released the parameters forward kept gathered (:func:`.stage3_gathered`): only the largest parameter's
  gradient is alive beside the staging.
* ZeRO-1/2's step without offload (:func:`flat_step_copies`) reads the 16-bit gradient partition twice before it
  releases it: the gradient norm converts each gradient slice to fp64, and the step flattens the partition into a
  new 16-bit tensor and casts that to the master's dtype; the rank's 16-bit gradient buffer is alive at both.
* ZeRO-1/2 with optimizer offload take each gradient slice's norm as it is copied to the host
  (``set_norm_for_param_grad_in_gpu``): an fp64 copy of the slice, beside ZeRO-2's gradient of a parameter larger
  than the reduce bucket, which bypasses the bucket (:func:`offload_reduce_moment`).
* The optimizer's own temporaries in the step (:func:`optimizer_temporaries`): torch's single-tensor Adam builds
  ``exp_avg_sq.sqrt()`` and its quotient (two fp32 tensors the size of the parameter it steps, and ZeRO-1/2/3
  step one flat partition per group, not per-layer tensors); the foreach variant one list the size of the whole
  group; FusedAdam and DeepSpeed's CPU-Adam step in place.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tuner.estimator.settings import FP32

ZERO0_ALLREDUCE_ELEMENTS = 500_000_000  # deepspeed.runtime.engine.MEMORY_OPT_ALLREDUCE_SIZE
NORM_BYTES = 8  # deepspeed.runtime.zero.utils.get_norm_dtype: fp64 where the accelerator has it (CUDA, CPU)


def allreduce_chunks(numels: tuple[int, ...] | list[int], limit: int) -> list[int]:
    """Element counts of the chunks DeepSpeed's ``allreduce_no_retain`` flattens: tensors are added until a chunk
    holds more than ``limit`` elements.

    >>> allreduce_chunks([3, 3, 3, 1], 5)
    [6, 4]
    """
    return list(_allreduce_chunks(tuple(numels), limit))


@lru_cache(maxsize=256)
def _allreduce_chunks(numels: tuple[int, ...], limit: int) -> tuple[int, ...]:
    chunks, filled = [], 0
    for numel in numels:
        filled += numel
        if filled > limit:
            chunks.append(filled)
            filled = 0
    if filled:
        chunks.append(filled)
    return tuple(chunks)


def bucket_chunks(numels: tuple[int, ...] | list[int], bucket: int) -> list[int]:
    """Element counts of ZeRO-1/2's contiguous gradient buckets in backward order (the last parameters first): a
    bucket is reduced when the next gradient would overflow it (``reduce_independent_p_g_buckets_and_remove_grads``).

    >>> bucket_chunks([4, 4, 4], 9)
    [8, 4]
    """
    return list(_bucket_chunks(tuple(numels), bucket))


@lru_cache(maxsize=1024)
def _bucket_chunks(numels: tuple[int, ...], bucket: int) -> tuple[int, ...]:
    chunks, filled = [], 0
    for numel in reversed(numels):
        if filled and filled + numel > bucket:
            chunks.append(filled)
            filled = 0
        filled += numel
    if filled:
        chunks.append(filled)
    return tuple(chunks)


def zero0_allreduce_copy(numels: tuple[int, ...], elem: int) -> int:
    """Bytes of the largest flattened chunk ZeRO-0 all-reduces after backward (every gradient is alive then)."""
    return elem * max(allreduce_chunks(numels, ZERO0_ALLREDUCE_ELEMENTS), default=0)


def flat_reduce_copy(
    numels: tuple[int, ...], bucket: int, elem: int, partition_grads: int, world: int, multi_rank: bool = True
) -> int:
    """Bytes ZeRO-1/2's bucket reduction adds at its worst moment beyond the rank's gradient partition
    (``partition_grads`` bytes, which the backward phase already counts).

    The first bucket is flattened before the partition is allocated, later ones beside it. Without
    ``use_multi_rank_bucket_allreduce`` each destination rank's slices are flattened apart (about 1/N each).
    """
    chunks = [chunk if multi_rank else -(-chunk // world) for chunk in bucket_chunks(numels, bucket)]
    if not chunks:
        return 0
    first = elem * chunks[0]
    later = partition_grads + elem * max(chunks[1:], default=0) if len(chunks) > 1 else 0
    return max(0, max(first, later) - partition_grads)


def stage3_reduce_copy(numels: tuple[int, ...], s: Any, elem: int, gloo: bool) -> int:
    """Bytes of ZeRO-3's reduce-scatter staging: ``reduce_scatter_coalesced`` concatenates the bucket's gradients,
    each padded to a multiple of the world size, into one flat tensor (beside the permanent gradient partition and
    the contiguous bucket); the largest bucket sets the transient. Persistent parameters' gradients are bucketed too.
    gloo's ``reduce_scatter_tensor`` (CPU ranks) clones its input once more (the allocator's records show an
    ``aten::clone`` under it); NCCL reduces in place. The largest parameter's full gradient (the embedding's, the
    last one backward produces) is still alive at the last reduction, and nothing else gathered: measured on 2 CPU
    ranks with the counting allocator (Pythia-160M, LLaMA-125M and Mixtral-140M shapes, bf16 and fp32, one bucket
    for the whole model), both ranks' peaks hold ``e × largest`` beyond the staging (LLaMA-125M bf16: 46.9 MiB,
    its 24.6M-element embedding).
    """
    world = s.zero_ranks
    padded = [-(-numel // world) * world for numel in numels]
    staging = elem * max(bucket_chunks(padded, s.reduce_bucket_size), default=0)
    return (2 * staging if gloo else staging) + elem * max(numels, default=0)


def flat_step_copies(
    elem: int, master: int, worst_grads: int, groups: tuple[int, ...], largest: int, beside: int = 0
) -> int:
    """Bytes ZeRO-1/2's step without offload holds at its worst moment beyond the step phase's gradient partition in
    the master's dtype (``master`` bytes × the partition, the sum of ``groups``, each group's partition in elements).

    DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer.step`` reads the rank's 16-bit gradients (``elem`` bytes each; the
    worst rank's buffer holds ``worst_grads`` elements, the parameters overlapping its partition whole) through
    ``averaged_gradients``, views that keep the buffer alive until each group's cast is made:

    * ``scaled_global_norm`` → ``get_grad_norm_direct`` converts each gradient slice to fp64 in turn (``largest``
      elements at most: the largest parameter's slice of the partition);
    * for each group, ``flatten(averaged_gradients)`` makes a new 16-bit flat partition and ``.to()`` its copy in
      the master's dtype (none when the master is 16-bit: ``.to`` returns the same tensor), both beside the buffer.

    ``beside``: bytes alive at both moments too (Muon's orthogonalised gradients, :func:`.muon_updates`). The larger
    moment, less the step phase's gradient partition (counting allocator, ``bench/precision_true_peak.py``).

    >>> flat_step_copies(2, 4, 110, (100,), 50)  # fp32 master: 2·110 + 2·100 + 4·100, less 4·100
    420
    >>> flat_step_copies(2, 2, 110, (100,), 50)  # bf16 master: the norm's 8·50 beside 2·110, less 2·100
    420
    """
    norm = elem * worst_grads + beside + NORM_BYTES * largest
    cast = elem * worst_grads + beside + max((elem + (master if master != elem else 0)) * group for group in groups)
    return max(norm, cast) - master * sum(groups)


def offload_reduce_moment(numel: int, elem: int, part: int, bucket: int, stage: int) -> int:
    """Bytes ZeRO-1/2 with optimizer offload add to backward while the gradient of one parameter of ``numel``
    elements is copied to the host (a partition of ``part`` elements, reduce buckets of ``bucket``).

    ``copy_grads_in_partition`` → ``set_norm_for_param_grad_in_gpu`` converts the rank's slice of the gradient to
    fp64 for its norm (``get_norm_dtype``); the cast to an fp32 master's dtype comes after it, half its size. At
    ZeRO-2 a gradient larger than the bucket bypasses it (``extra_large_param_to_reduce``, cloned under the offload's
    gradient protections), so it is alive beside the buckets; ZeRO-1's backward phase already holds every 16-bit
    gradient (counting allocator, ``bench/precision_true_peak.py``, the seq-32 offload rows).

    >>> offload_reduce_moment(100, 2, 60, 50, 2), offload_reduce_moment(100, 2, 60, 50, 1)
    (680, 480)
    """
    own = elem * numel if stage == 2 and numel > bucket else 0
    return NORM_BYTES * min(numel, part) + own


def optimizer_temporaries(impl: str, largest_master: int, total_master: int) -> int:
    """Bytes the Adam implementation ``impl`` allocates inside its step, for fp32 master tensors of at most
    ``largest_master`` and in all ``total_master`` elements (one rank).

    >>> optimizer_temporaries("torch_single", 10, 30), optimizer_temporaries("fused", 10, 30)
    (80, 0)
    """
    if impl == "torch_single":
        return 2 * FP32 * largest_master
    if impl == "torch_foreach":
        return FP32 * total_master
    return 0
