"""Model states of ZeRO stage 3: each rank's shard of the parameters (on the device, or offloaded to the host or
NVMe), its gradient partition, optimizer states and reduce bucket, as DeepSpeed 0.19 holds them (measured,
``tests/estimator/test_estimator_deepspeed.py``):

* Every parameter is partitioned, each padded to a multiple of the world size (:func:`.stage3_partition`); the
  whole ones ZeRO-3 holds beside the shards (persistent, gathered, saved) are :mod:`.stage3_gathered`'s. Under
  AutoTP the tp-sharded Linears are partitioned over the data-parallel ``world / tp`` ranks and the parameters AutoTP
  leaves whole (embeddings, norms) over all ranks: ``zero.Init`` partitioned them over the world when the model was
  built, and AutoTP re-creates only the Linears it shards (measured: 721,216 shard elements per rank on a tiny LLaMA
  whose rank holds 458,752 sharded + 524,928 whole elements, at tp = 2 on 2 ranks: ``bench/tp_true_peak.py``).
* The reduce bucket (``reduce_bucket_size`` elements, with ``contiguous_gradients``) stays allocated from start to
  end, and so does the flat 16-bit gradient partition; the fp32 copy of the gradients exists during the optimizer
  step only, beside it, one ``sub_group_size`` sub-group at a time. With optimizer offload both gradient partitions
  live on the host for the whole run, the fp32 one in a buffer per sub-group.
* With a peft adapter (:mod:`.trainable`) frozen shards are partitioned like the rest, peft's fp32 adapters stay
  fp32 (shards and persistent copies), and only the trainable shard has gradients and optimizer states;
  ``zero_quantized_nontrainable_weights`` holds the frozen shards int8 (:mod:`.quantized`).
"""

from __future__ import annotations

from tuner.estimator.layouts.zeropp import qgz_reduce_transient
from tuner.estimator.settings import FP32, Settings
from tuner.estimator.states.master_states import state_bytes
from tuner.estimator.states.partitions import stage3_layout, stage3_partition
from tuner.estimator.states.pinned import HostPins
from tuner.estimator.states.quantized import quantized_base, quantized_shard_bytes, stage3_view
from tuner.estimator.states.stage3_gathered import stage3_gathered
from tuner.estimator.states.trainable import TrainedParams, stage3_bytes
from tuner.estimator.states.transients import optimizer_temporaries, stage3_reduce_copy
from tuner.estimator.terms import NOTHING, Contribution, Entry, detail, held, transient
from tuner.estimator.tiled_loss import head_gradient, head_gradient_bytes
from tuner.workload import Workload


def stage3_states(workload: Workload, s: Settings, params: TrainedParams) -> tuple[int, Contribution]:
    """Model states and buffers of ZeRO stage 3 of the model as trained (``params``): (NVMe bytes per rank, their
    contribution)."""
    model, elem, cuda = workload.model, s.param_bytes, workload.cluster.device == "cuda"
    base = quantized_base(workload, params)
    out: list[Entry] = []
    if base is not None:  # 4-bit weights as ZeRO-3 holds them: partitioned packed data, or whole (uint8)
        params, whole = stage3_view(params, base, elem)
        out += detail("quantized_weights_whole", whole) + held("gpu", "parameters", whole)
    part = stage3_partition(
        params.numels,
        s.zero_ranks,
        s.param_persistence_threshold,
        s.model_persistence_threshold,
        model.replicated,  # AutoTP: parameters every tp rank holds whole are partitioned over all ranks
        s.ranks.tensor,
        model.experts,  # AutoEP: the rank's experts over the world / ep expert-data-parallel ranks
        s.ranks.expert,
    )
    shard, persistent = part.shard, part.persistent
    out += detail("partition_elements", shard) + detail("persistent_elements", persistent)
    shard_bytes, upcast = elem * shard, 0  # frozen parameters are partitioned like the rest
    if not params.is_full:  # peft's fp32 adapters stay fp32; only the trainable shard has gradients and states
        kept = stage3_bytes(params, s.zero_ranks, elem, s.param_persistence_threshold, s.model_persistence_threshold)
        shard_bytes, upcast = kept.shard_bytes, kept.persistent_bytes - elem * persistent
        shard = kept.trainable_shard
        out += detail("trainable_partition_elements", shard)
        if s.quantized_nontrainable:  # frozen shards held int8 with fp32 scales
            saved = _quantized_nontrainable_saving(params, s, elem)
            out += detail("quantized_nontrainable_saving", saved)
            shard_bytes -= saved
    nvme, placed = _place_shard(shard_bytes, s, cuda)
    out += placed
    if s.zero_ranks > 1 and not model.is_bare:
        out += stage3_gathered(workload, params, part, s)
        out += held("gpu", "parameters", upcast, ("forward", "backward"))  # fp32 adapters' whole copies
    elif any(model.replicated):  # AutoTP on tp ranks only: its replicated parameters are partitioned, over tp
        out += _replicated_gathered(workload, params, s)
    out += head_gradient(head_gradient_bytes(workload, s, params.mask))  # ALST's tiled loss (:mod:`.tiled_loss`)
    bucket = s.reduce_bucket_size * s.reduce_bytes if s.contiguous_gradients else 0  # fp32 under Ulysses
    out += detail("reduce_buckets", bucket) + held("gpu", "buffers", bucket)
    if not model.is_bare:
        gloo = workload.cluster.device == "cpu"
        if s.quantized_gradients:  # qgZ: tensor by tensor through int4 all-to-alls, no flat bucket (.layouts.zeropp)
            largest = max(params.trainable, default=0)
            local = min(workload.cluster.gpus_per_node, s.zero_ranks)
            copy = qgz_reduce_transient(largest, local) + elem * largest
        else:
            copy = stage3_reduce_copy(params.trainable, s, elem, gloo)
        out += transient("reduce_copy", "backward", copy)
    swapped, states = _optimizer_states(shard, s, cuda)
    return nvme + swapped, (*out, *states)


def _replicated_gathered(workload: Workload, params: TrainedParams, s: Settings) -> Contribution:
    """The gathered parameters when the data-parallel degree is 1 under AutoTP: only the replicated ones are
    partitioned (over the tp ranks), so only they are gathered."""
    kept = tuple(n for n, whole in zip(params.numels, workload.model.replicated, strict=True) if whole)
    thresholds = (s.param_persistence_threshold, s.model_persistence_threshold)
    part = stage3_partition(kept, s.ranks.tensor, *thresholds)
    return stage3_gathered(workload, TrainedParams(kept, kept, max(kept)), part, s)


def _place_shard(shard_bytes: int, s: Settings, cuda: bool) -> tuple[int, Contribution]:
    """The parameter shard on the device, or with ``offload_param`` on the host or NVMe: (its NVMe bytes, its
    contribution)."""
    pins = HostPins(cuda)
    if s.offload_param == "nvme":
        swap = s.offload_param_buffer_count * s.offload_param_buffer_size * s.param_bytes
        return shard_bytes, held("cpu", "buffers", pins.locked(swap)) + pins.contribution()
    if s.offload_param == "cpu":  # one flat buffer, pinned whatever offload_param.pin_memory says
        return 0, held("cpu", "parameters", pins.size(shard_bytes, True)) + pins.contribution()
    return 0, held("gpu", "parameters", shard_bytes)


def _optimizer_states(shard: int, s: Settings, cuda: bool) -> tuple[int, Contribution]:
    """The trainable ``shard``'s gradient partitions and optimizer states (on the device, or offloaded to the host
    or NVMe): (their NVMe bytes, their contribution)."""
    elem, kept = s.param_bytes, state_bytes(s)  # fp32 or bf16 master and moments (.master_states)
    states = kept.states * shard
    group = min(shard, s.sub_group_size) if s.sub_group_size else shard
    if s.offload_optimizer == "none":
        return 0, (
            *held("gpu", "optimizer_states", states),
            *held("gpu", "gradients", elem * shard),  # the flat gradient partition buffer is permanent
            *held("gpu", "gradients", kept.master * group, ("step",)),
            *transient("optimizer_temporaries", "step", optimizer_temporaries(s.optimizer_impl, group, shard)),
        )
    # with offload the 16-bit gradient partition and its fp32 copy both live on the host for good
    pins = HostPins(cuda)
    groups, grouped = _sub_group_grads(shard, s, cuda)
    out = held("cpu", "gradients", pins.size(elem * shard, s.offload_optimizer_pin) + groups) + grouped
    if s.offload_optimizer == "nvme":
        swap = s.offload_optimizer_buffer_count * min(shard, s.sub_group_size or shard) * FP32
        return states, out + held("cpu", "buffers", pins.locked(swap)) + pins.contribution()
    return 0, out + held("cpu", "optimizer_states", states) + pins.contribution()


def _quantized_nontrainable_saving(params: TrainedParams, s: Settings, elem: int) -> int:
    """Bytes ``zero_quantized_nontrainable_weights`` saves per rank: each frozen shard int8 with its fp32 scales
    (:func:`.quantized_shard_bytes`) instead of its dtype."""
    parts, _ = stage3_layout(params.numels, s.zero_ranks, s.param_persistence_threshold, s.model_persistence_threshold)
    upcast = params.fp32 or (False,) * len(parts)
    saved = 0
    for part, train, up in zip(parts, params.mask, upcast, strict=True):
        if not train:
            saved += (FP32 if up else elem) * part - quantized_shard_bytes(part)
    return saved


def _sub_group_grads(shard: int, s: Settings, cuda: bool) -> tuple[int, Contribution]:
    """Host bytes of ZeRO-3's master-dtype gradient buffers with optimizer offload, and their pinned bytes: one per
    sub-group of ``sub_group_size`` elements (the shard cut into equal sub-groups, as the step's gradients are
    sized), each pinned alone."""
    group = min(shard, s.sub_group_size) if s.sub_group_size else shard
    if group == 0:
        return 0, NOTHING
    full, rest = divmod(shard, group)
    pin = s.offload_optimizer_pin and s.offload_optimizer == "cpu"  # NVMe steps swapped sub-groups in one buffer
    master, pins = state_bytes(s).master, HostPins(cuda)
    return pins.size(master * group, pin, count=full) + pins.size(master * rest, pin), pins.contribution()
