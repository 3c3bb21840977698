"""Model states of ZeRO stages 0, 1 and 2: parameters, gradients, optimizer states and reduce buckets per rank,
as DeepSpeed 0.19 holds them, measured (``tests/estimator/test_estimator_deepspeed.py``), not only the ZeRO paper:

* Mixed precision keeps 16-bit parameters and gradients, and an fp32 master with Adam's two moments (12 B/param)
  in the optimizer. fp32 training without ZeRO keeps no separate master (8 B/param of optimizer state); with ZeRO
  1-3 it does (12 B/param), so fp32 ZeRO training holds 20 B/param on one rank, not 16.
* ZeRO-2 reduces gradients into partitions as backward produces them: ``2Ψ/N``, where a rank's gradient buffer
  holds whole the parameters that straddle its partition boundary. ZeRO-1 in DeepSpeed 0.19 holds all ``2Ψ`` 16-bit
  gradients at the end of backward (as the paper says), then reduces them into the same partitions as ZeRO-2, so
  after backward and in the step it measures like ZeRO-2.
* The fp32 copy of the gradients (``4Ψ/N``) exists only during the optimizer step, when the 16-bit gradient partition
  has been released (ZeRO-1/2) or is kept beside it (ZeRO-0, like ZeRO-3's permanent flat gradient buffer).
  With optimizer offload it lives on the CPU for the whole run.
* ZeRO-1/2 allocate their reduce bucket only during backward, twice with ``overlap_comm`` (double buffering), and
  only with ``contiguous_gradients`` or optimizer offload (with offload, ZeRO-1 keeps one copy; with offload,
  ``overlap_comm``, no ``contiguous_gradients`` and gradient accumulation, both copies stay between micro-steps).
  DeepSpeed's docs quote ``4.5×`` the bucket sizes for ``overlap_comm``; the 0.19 code allocates two reduce buckets.

Frozen parameters (:mod:`.trainable`) have no gradients, masters or optimizer states: they stay whole on every rank
in the training dtype, outside the flat groups (4-bit weights as their packed data and quant state, :mod:`.quantized`).
"""

from __future__ import annotations

from tuner.estimator.layouts.autoep import ep_flat_partition
from tuner.estimator.phases import PHASES
from tuner.estimator.settings import FP32, Settings
from tuner.estimator.states.master_states import state_bytes
from tuner.estimator.states.muon import (
    muon_flat_partition,
    muon_mask,
    muon_states,
    muon_update_transient,
    muon_updates,
    split,
)
from tuner.estimator.states.partitions import round_robin_order
from tuner.estimator.states.pinned import HostPins
from tuner.estimator.states.quantized import quantized_base
from tuner.estimator.states.trainable import TrainedParams
from tuner.estimator.states.transients import (
    bucket_chunks,
    flat_reduce_copy,
    flat_step_copies,
    offload_reduce_moment,
    optimizer_temporaries,
    zero0_allreduce_copy,
)
from tuner.estimator.terms import NOTHING, Contribution, Entry, detail, held, transient
from tuner.estimator.tiled_loss import head_gradient, head_gradient_bytes
from tuner.workload import Workload

ADAM_STATE_BYTES = 8  # two fp32 moments per parameter


def flat_states(workload: Workload, s: Settings, params: TrainedParams) -> tuple[int, Contribution]:
    """Model states and buckets of ZeRO stages 0, 1 and 2 of the model as trained (``params``): (NVMe bytes, none: 0;
    their contribution).

    ``round_robin_gradients`` reorders the flat buffer (:func:`.round_robin_order`): the sizes are unchanged, only
    which parameters straddle a partition boundary, so it moves ZeRO-2's worst-rank gradient buffer a little. With
    optimizer offload (where it is meant to be used) nothing estimated depends on the order.
    """
    model, elem = workload.model, s.param_bytes
    frozen = elem * params.n_frozen  # whole on every rank, in the training dtype, outside the flat groups
    base = quantized_base(workload, params)
    out: list[Entry] = []
    if base is not None:  # 4-bit weights: packed data and quant state instead, whole on every rank too
        frozen += base.packed + base.state - elem * base.elements
        out += detail("quantized_weights", base.packed + base.state)
    head = head_gradient_bytes(workload, s, params.mask)  # ALST's tiled loss: in forward (:mod:`.tiled_loss`)
    out += head_gradient(head)
    if s.stage == 0:
        return 0, (*out, *_stage0_states(params, frozen, s, head))
    numels, experts = params.trainable, model.experts  # AutoEP: expert groups over world / ep (.layouts.autoep)
    if s.round_robin_gradients and s.zero_ranks > 1 and not any(experts):
        numels = round_robin_order(numels, s.zero_ranks)
    flat = muon_flat_partition(model, numels, s) if s.muon else ep_flat_partition(numels, experts, s)
    part = flat.partition
    worst_grads = part if model.is_bare else flat.worst_rank_grads
    out += detail("partition_elements", part)
    out += held("gpu", "parameters", elem * flat.padded_total + frozen)
    out += _reduce_buckets(s)
    if s.stage == 1:  # ZeRO-1 reduces after backward: every 16-bit gradient is alive first, offloaded or not
        out += held("gpu", "gradients", elem * params.n_trainable, ("backward",))
        out += _held_between_micro_steps(s, head, elem * params.n_trainable)
    states = state_bytes(s)  # fp32 or bf16 master and moments (.master_states)
    if s.offload_optimizer != "none":
        return 0, (*out, *_offloaded_states(params, part, s, workload.cluster.device == "cuda"))
    optimizer = muon_states(model, numels, s, states.master, elem) if s.muon else states.states * part
    out += held("gpu", "optimizer_states", optimizer)
    if s.stage == 2:  # ZeRO-2 reduces as gradients arrive, into this rank's partition
        out += held("gpu", "gradients", elem * worst_grads, accumulated(s))
    out += held("gpu", "gradients", states.master * part, ("step",))
    reduce_copy = _reduce_copy(workload, s, numels, elem * worst_grads)
    out += transient("reduce_copy", "backward", reduce_copy)
    if s.muon:  # Newton-Schulz on one whole gradient at a time, at the end of backward (.muon)
        out += _muon_backward(workload, s, (numels, params.n_trainable), elem * worst_grads, reduce_copy)
    temporaries = optimizer_temporaries(s.optimizer_impl, part, part)
    out += transient("optimizer_temporaries", "step", temporaries)
    largest = min(params.largest_trainable, flat.largest_group)
    updates = muon_updates(model, numels, s, elem) if s.muon else 0
    copies = flat_step_copies(elem, states.master, worst_grads, flat.groups or (part,), largest, updates)
    out += transient("gradient_copies", "step", max(0, copies - temporaries))  # the larger of the two moments
    return 0, tuple(out)


def _muon_backward(
    workload: Workload, s: Settings, trained: tuple[tuple[int, ...], int], partition_grads: int, reduce_copy: int
) -> Contribution:
    """Muon's moment at the end of backward, after the reduction (``reduce_copy`` bytes at its worst, earlier):
    the orthogonalised gradients made so far and Newton-Schulz's temporaries for one matrix, beside the rank's
    gradient partition (``partition_grads`` bytes). ZeRO-1's backward phase holds every 16-bit gradient
    (``trained``: the parameters and how many), which its reduction has replaced by the partition by then. What the
    moment holds beyond the reduction's worst is the ``muon_update`` transient (counting allocator, the Muon rows of
    ``bench/precision_true_peak.py``: the two moments do not coincide)."""
    model, (numels, n), elem = workload.model, trained, s.param_bytes
    released = elem * n - partition_grads if s.stage == 1 else 0
    moment = muon_updates(model, numels, s, elem) + muon_update_transient(model, numels, workload.cluster.device)
    return transient("muon_update", "backward", max(0, moment - released - reduce_copy))


def accumulated(s: Settings) -> tuple[str, ...]:
    """The phases a micro-step's gradient partition is alive in: backward, and with gradient accumulation every later
    micro-step's forward too (ZeRO-2's ``grads_in_partition`` holds what the earlier micro-steps reduced until the
    step; counting allocator: ``bench/results/sp_true_peak.md``, accumulation)."""
    return ("forward", "backward") if s.grad_accum > 1 else ("backward",)


def _held_between_micro_steps(s: Settings, head: int, grads: int) -> Contribution:
    """ZeRO-0 and ZeRO-1 reduce at the step only: with gradient accumulation every 16-bit gradient (``grads``
    bytes) is alive in a later micro-step's forward, the tiled loss's head gradient (``head`` bytes) among them (it
    accumulates into the head's own, :func:`.head_gradient` counted it)."""
    return held("gpu", "gradients", grads - head, ("forward",)) if s.grad_accum > 1 else NOTHING


def _stage0_states(params: TrainedParams, frozen: int, s: Settings, head: int) -> Contribution:
    """ZeRO-0: every state whole on every rank; ``frozen``: the frozen parameters' bytes; ``head``: the tiled loss's
    head gradient."""
    elem, mixed = s.param_bytes, s.precision != "fp32"
    n = params.n_trainable
    out = [
        *held("gpu", "parameters", elem * n + frozen),
        *held("gpu", "optimizer_states", (FP32 * n if mixed else 0) + ADAM_STATE_BYTES * n),
        *held("gpu", "gradients", elem * n, ("backward", "step")),
        *_held_between_micro_steps(s, head, elem * n),
    ]
    if mixed:  # FP16_Optimizer builds fp32 gradients beside the 16-bit ones for the step
        out += held("gpu", "gradients", FP32 * n, ("step",))
    out += transient("allreduce_copy", "backward", zero0_allreduce_copy(params.trainable, elem))
    largest = n if mixed else params.largest_trainable
    step = optimizer_temporaries(s.optimizer_impl, largest, n)
    if mixed:  # FP16_Optimizer.step: every p.grad.to(fp32) alive in a list while they are concatenated
        step = max(step, FP32 * n)
        if s.ranks.sequence > 1:  # the norm on an sp rank above 0 (the worst rank)
            step = max(step, _masked_norm(n, elem))
    out += transient("step_temporaries", "step", step)
    return tuple(out)


def _masked_norm(n: int, elem: int) -> int:
    """FP16_Optimizer's gradient norm on a model-parallel rank above 0 of Ulysses' mpu, beyond what the step phase
    holds: it masks the parameters it counts as duplicates (all of them) with a zeros tensor, its cumsum and their
    bool over the flat fp32 gradient's n + 1 elements (9 B each at once; ``deepspeed/runtime/utils.py``
    ``get_flattened_grad_norm``), the 16-bit gradients already released (counting allocator:
    ``bench/results/sp_true_peak.md``, the ZeRO-0 rows)."""
    return 9 * (n + 1) - elem * n


def _reduce_buckets(s: Settings) -> Contribution:
    """ZeRO-1/2's reduce buckets: in backward only, as many copies as ``overlap_comm`` and offload allocate."""
    bucket_phases: tuple[str, ...] = ("backward",)
    offload = s.offload_optimizer != "none"
    if s.contiguous_gradients or offload:
        copies = 2 if s.overlap_comm and (s.stage == 2 or not offload) else 1
        if offload and s.overlap_comm and not s.contiguous_gradients and s.grad_accum > 1:
            copies, bucket_phases = 2, PHASES  # measured: with accumulation this path keeps both between micro-steps
    else:
        copies = 0
    bucket = s.reduce_bucket_size * s.reduce_bytes * copies  # fp32 under Ulysses (Settings.reduce_bytes)
    out = detail("reduce_buckets", bucket) + held("gpu", "buffers", bucket, bucket_phases)
    if s.tiled_loss_shards > 1 and "forward" not in bucket_phases:
        # ALST's TiledFusedLogitsLoss runs the LM head's backward inside forward: its gradient hook allocates the
        # buckets there (stage_1_and_2.py process_gradients -> setup_buckets), in the training dtype (measured:
        # bf16 under Ulysses too; the reduction's fp32 copy comes only in backward), and they stay until the step
        forward = s.reduce_bucket_size * s.param_bytes * copies
        out += detail("reduce_buckets_forward", forward) + held("gpu", "buffers", forward, ("forward",))
    return out


def _offloaded_states(params: TrainedParams, part: int, s: Settings, cuda: bool) -> Contribution:
    """ZeRO-1/2 with optimizer offload: the fp32 master, moments and gradient partition on the host, with the
    staging buffers that carry gradients out and 16-bit parameters back (``part``: the partition's elements;
    ``cuda``: pinned buffers cost their power-of-two size, :mod:`.pinned`)."""
    elem, largest, states = s.param_bytes, params.largest_trainable, state_bytes(s)
    pins, pin, bucket = HostPins(cuda), s.offload_optimizer_pin, s.reduce_bucket_size
    master = pins.size(states.master * part, pin)  # the master partition; Adam's moments are pageable
    gradients = pins.size(states.master * part, pin)  # its gradient, always allocated
    staging = pins.size(elem * part, pin) + pins.size(elem * largest, pin)  # 16-bit param copy-back, grad staging
    return (
        *held("cpu", "optimizer_states", master + states.moments * part),
        *held("cpu", "gradients", gradients),
        *held("cpu", "buffers", staging),
        *held("gpu", "buffers", elem * largest),  # device-side gradient staging buffer
        *detail("offload_staging", elem * part + 2 * elem * largest),
        *pins.contribution(),
        *transient("offload_reduce", "backward", offload_reduce_moment(largest, elem, part, bucket, s.stage)),
    )


def _reduce_copy(workload: Workload, s: Settings, numels: tuple[int, ...], partition_grads: int) -> int:
    """ZeRO-1/2's flattened bucket copy beyond what the backward phase holds (:func:`.flat_reduce_copy`).

    ZeRO-2's backward phase holds the gradient partition; ZeRO-1's holds every 16-bit gradient, which its
    after-backward reduction frees as it copies them into buckets, so only the partition allocated after the first
    bucket can add to it.
    """
    model, elem = workload.model, s.param_bytes
    if model.is_bare or not s.reduce_scatter:
        return 0
    if s.stage == 2:
        return flat_reduce_copy(
            numels, s.reduce_bucket_size, elem, partition_grads, s.zero_ranks, s.multi_rank_bucket_allreduce
        )
    chunks = bucket_chunks(_stage1_reduce_order(workload, s, numels), s.reduce_bucket_size)
    return max(0, partition_grads - elem * chunks[0]) if len(chunks) > 1 else 0


def _stage1_reduce_order(workload: Workload, s: Settings, numels: tuple[int, ...]) -> tuple[int, ...]:
    """The parameters in the order ZeRO-1 fills its buckets, as :func:`.bucket_chunks` reads them (last first):
    without ``overlap_comm`` ``reduce_gradients`` runs after backward, group by group (Muon's first) and each group in
    model order; with it the gradient hooks reduce in backward's order."""
    if s.overlap_comm:
        return numels
    groups = split(numels, muon_mask(workload.model)) if s.muon else (numels,)
    return tuple(reversed([numel for group in groups for numel in group]))
