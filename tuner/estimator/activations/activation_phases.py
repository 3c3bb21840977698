"""Activations and their workspaces in a step's phases: what forward saves, the logits workspace, the block
backward recomputes under checkpointing, and backward's worst moments, which can come before its end.

Activations come from the workload's model profile when it carries one (traced from the real transformers model,
:mod:`tuner.profile`; plain data here, no torch), else from the built-in models' formulas
(:mod:`.saved`). ``forward`` holds them with the logits workspace; ``backward`` the recomputed
block when checkpointing. With a peft adapter or frozen parameters backward's worst moments come before the weight
gradients (:func:`_frozen_backward`); otherwise, with more than one reduce bucket, at the first bucket's
reduction (:func:`_early_backward`).
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.estimator.activations.attention import extra_bytes_per_layer
from tuner.estimator.activations.autocast import activation_precision
from tuner.estimator.activations.chunked_loss import chunked_loss_terms
from tuner.estimator.activations.first_recompute import first_recompute_extra
from tuner.estimator.activations.liger import compute_capability, liger_activations
from tuner.estimator.activations.plain_loss import loss_workspace
from tuner.estimator.activations.saved import LayerActivations, workload_activation_bytes
from tuner.estimator.activations.stage3_backward import stage3_start_extra
from tuner.estimator.layouts.ulysses import local_seq, long_context_terms
from tuner.estimator.phases import Phase
from tuner.estimator.settings import Settings
from tuner.estimator.states.pinned import HostPins
from tuner.estimator.states.trainable import TrainedParams
from tuner.estimator.states.transients import bucket_chunks, offload_reduce_moment
from tuner.estimator.terms import NOTHING, Contribution, Entry, detail, held
from tuner.estimator.tiled_loss import whole_parameters_apart
from tuner.workload import Workload

FORWARD, BACKWARD = ("forward",), ("backward",)


def activation_terms(
    workload: Workload, s: Settings, params: TrainedParams, recorded: Mapping[str, int], phases: Mapping[str, Phase]
) -> tuple[str | None, Contribution]:
    """The activations and the logits workspace of the model as trained (``params``): (where their sizes come from,
    ``trace`` or ``formula``, None when unknown (a bare parameter count); their contribution). ``recorded`` and
    ``phases``: what the model states recorded before (their reduce copy, buckets, gathered parameters)."""
    model, train, elem = workload.model, workload.train, s.param_bytes
    # the model as trained is traced as ZeRO-3 trains it: peft's fp32 adapters kept (the engine casts them at stages
    # 0-2), and every Linear saving its input (zero.Init's memory-efficient linear: frozen weights' inputs too)
    adapters = ""
    if s.stage == 3 and not params.is_full:
        adapters = "zero3" if s.memory_efficient_linear else "fp32"
    activations = workload_activation_bytes(
        workload,
        s.micro_batch,
        activation_precision(workload, s),  # traced under the ds_config's torch_autocast where the profile has it
        elem,
        s.activation_checkpointing,
        adapters,
        s.ranks.sequence,
        s.ranks.tensor,
    )
    if activations is None:
        return None, NOTHING
    out: list[Entry] = []
    seq = local_seq(workload, s)  # Ulysses: each rank's s/sp tokens (:mod:`.layouts.ulysses`)
    workspace = loss_workspace(model, s.micro_batch, seq, elem, s.autocast)  # HF's, or a loss without its upcast
    activations, workspace, kernels = _other_kernels(workload, s, activations, workspace)
    out += kernels
    acts, context = long_context_terms(workload, s, activations, workspace)
    out += context
    saved, recompute, source = acts.saved, acts.recompute, activations.source
    if workload.cluster.device == "cuda":  # the CUDA attention kernels' padded log-sum-exp and RNG state
        kernel_extra = extra_bytes_per_layer(model, s.micro_batch, train.seq_len, s.precision, train.attention)
        kernel_extra //= s.ranks.model_parallel  # a rank's h/(sp·tp) heads
        if s.activation_checkpointing:  # only the recomputed block holds attention outputs
            recompute += kernel_extra
        else:
            kernel_extra *= model.num_layers
            saved += kernel_extra
        out += detail("attention_kernel_extra", kernel_extra)
    if s.ranks.tensor > 1:  # each row-parallel output (attention, MLP) all-reduced whole, in place
        out += detail("tp_allreduce_bytes", elem * s.micro_batch * seq * model.hidden_size)
    out += detail("logits_workspace", acts.workspace) + detail("recomputed_block", recompute)
    out += held("gpu", "activations", saved, FORWARD) + held("gpu", "buffers", acts.workspace, FORWARD)
    layer_saved = acts.recompute_saved + recompute - acts.recompute  # with CUDA's kernel extra
    out += _recompute_beside_staging(s, recompute, layer_saved, recorded)
    if acts.host:  # checkpoints offloaded to host memory (pinned on CUDA), from forward until backward used them
        pins = HostPins(workload.cluster.device == "cuda")
        host = pins.size(acts.host // acts.host_count, True, acts.host_count)
        out += held("cpu", "activations", host, ("forward", "backward")) + pins.contribution()
    loss = acts.workspace  # the loss's moment: workspace and head gradient
    first = first_recompute_extra(workload, s, phases)  # the other layers' checkpoints beside the first recompute
    if params.is_full:
        out += _early_backward(workload, s, (params, saved, first), recorded, phases)
    else:
        head, frozen = _frozen_backward(workload, s, saved, acts.workspace, first)
        out += frozen
        loss += head
    return source, (*out, *_forward_moments(s, activations, (saved, acts.outside, loss), recorded))


def _other_kernels(
    workload: Workload, s: Settings, activations: LayerActivations, workspace: int
) -> tuple[LayerActivations, int, Contribution]:
    """The model's activations and the loss's workspace with DeepSpeed's chunked cross-entropy (:mod:`.chunked_loss`)
    or Liger-Kernel's layers and fused linear cross-entropy (:mod:`.liger`) in place of Hugging Face's (never both:
    :func:`tuner.workload.numerics.check_numerics`), and what they record."""
    if s.chunked_loss:
        activations, workspace, changed = _chunked_loss(workload, s, activations)
        return activations, workspace, detail("chunked_loss_saved", changed)
    if s.liger:
        at = (s.micro_batch, local_seq(workload, s), s.param_bytes)
        capability = compute_capability(workload.cluster.gpu_type)
        return liger_activations(workload.model, activations, at, s.activation_checkpointing, capability)
    return activations, workspace, NOTHING


def _chunked_loss(workload: Workload, s: Settings, activations: LayerActivations) -> tuple[LayerActivations, int, int]:
    """The model's activations, the loss's workspace and what its saved tensors change with DeepSpeed's chunked
    loss (:mod:`.chunked_loss`): its saved tensors instead of the fp32 log-softmax, its blocks and logits gradient
    instead of the fp32 workspace."""
    tokens = s.micro_batch * local_seq(workload, s)
    changed, workspace = chunked_loss_terms(tokens, workload.model.vocab_size, s.param_bytes, workload.cluster.device)
    saved, outside = activations.saved + changed, activations.outside + changed
    return activations._replace(saved=saved, outside=outside), workspace, changed


def _recompute_beside_staging(s: Settings, worst: int, layer_saved: int, recorded: Mapping[str, int]) -> Contribution:
    """What the recomputed layer adds to the backward phase beside ZeRO 1-3's reduction staging (the phase's
    ``reduce_copy`` transient), given its ``worst`` moment and its ``layer_saved`` tensors.

    A bucket is reduced inside a gradient hook, after an autograd op returned; the layer's worst moment (RMSNorm's
    fp32 gradient temporaries) is inside an op. The two never coincide: the phase holds the larger of the worst
    moment and the layer's saved tensors beside the staging. Measured (``bench/sp_true_peak.py``, checkpointed,
    seq 8192): counting both at once put ZeRO-3 +8.3 % and ZeRO-2 +3.7 % over the true peak.
    """
    staging = recorded.get("reduce_copy", 0) if s.activation_checkpointing and s.stage else 0
    if not staging or worst <= layer_saved:
        return held("gpu", "activations", worst, BACKWARD)
    kept = max(worst - staging, layer_saved)
    return detail("recomputed_block_beside_staging", kept) + held("gpu", "activations", kept, BACKWARD)


def _forward_moments(
    s: Settings, traced: LayerActivations, rank: tuple[int, int, int], recorded: Mapping[str, int]
) -> Contribution:
    """The forward phase's moments other than the loss's (``saved`` activations beside its ``workspace``),
    where traced larger: before the first layer (a mask the model builds: ``pre_layer_peak``), the layers' end
    with what the model held into them (``pre_layer_held``) and, without checkpointing, the first layer's backward
    on top of every layer's saved tensors (what the head and loss saved is freed by then), its temporaries beyond
    what it saved (``excess``: eager attention's fp32 score gradients, a gated MLP's). The largest moment's excess
    over the loss's is added to the phase's activations (``details["forward_moment_extra"]``); under ZeRO-3's tiled
    loss the loss's moment holds no whole parameter (:func:`.tiled_loss.whole_parameters_apart`). ``rank``: (saved,
    of it outside the layers, the loss's workspace and head gradient) on this rank."""
    saved, outside, workspace = rank
    in_layers = saved - outside
    if not s.activation_checkpointing:
        in_layers += traced.excess_outside_mlp if s.tiled_mlp_shards > 1 else traced.excess
    moment = max(traced.pre_layer_peak, saved + traced.pre_layer_held, in_layers)
    # ALST's tiled loss: the head's accumulated gradient and ZeRO-1/2's first buckets exist only from the loss on
    loss = workspace + recorded.get("tiled_loss_head_grad", 0) + recorded.get("reduce_buckets_forward", 0)
    extra = moment - saved - loss
    out = detail("forward_moment_extra", extra) + held("gpu", "activations", extra, FORWARD) if extra > 0 else NOTHING
    return out + whole_parameters_apart(s, recorded, -extra)  # ZeRO-3's tiled loss holds no whole parameter


def _frozen_backward(
    workload: Workload, s: Settings, saved: int, workspace: int, first: int = 0
) -> tuple[int, Contribution]:
    """Backward's worst moments when few parameters train (measured, ``bench/peft_memory.py``): their gradients
    are too small to matter, so the peak comes before them. Returns (the loss's backward beyond the logits
    ``workspace``, the contribution).

    * The loss's backward, before any gradient reaches a weight: beside every saved activation, the fp32 gradient
      of the log-softmax's input and the gradient of the logits in the training dtype on its way back through the
      LM head (``(4 + e)·b·s·V``) beside the logits (``e·b·s·V``); what that is beyond the logits workspace
      (``8·b·s·V``: nothing in bf16, measured) is ``details["loss_backward"]``, counted in the forward phase. Under
      a tiled loss the head's gradient is made in forward, shard by shard: ``e·b·s·V`` stays counted.
    * The first trainable gradient arrives in the last layer's backward, when ZeRO 1-3 allocate their reduce
      bucket: the saved activations of every other layer are still alive (``(L-1)/L`` of them:
      ``details["early_backward_activations"]``), counted in the backward phase beside the bucket; at least the
      checkpoints beside the first recomputed layer (``first``, :mod:`.first_recompute`).
    """
    model, elem = workload.model, s.param_bytes
    logits = s.micro_batch * local_seq(workload, s) * model.vocab_size
    head = elem * logits
    if s.tiled_loss_shards <= 1:
        head = max(0, (2 * elem + 4) * logits - workspace)
    out = detail("loss_backward", head) + held("gpu", "buffers", head, FORWARD) if head else NOTHING
    layers = max(1, model.num_layers)
    if s.stage and s.offload_optimizer == "none" and saved * (layers - 1) // layers >= first:
        alive = saved * (layers - 1) // layers
        out += detail("early_backward_activations", alive) + held("gpu", "activations", alive, BACKWARD)
    else:
        out += _first_recompute(first)
    return head, out


def _first_offload_reduce(numels: tuple[int, ...], first: int, s: Settings, recorded: Mapping[str, int]) -> int:
    """What ZeRO-2 with optimizer offload adds while the first bucket's gradients (the last parameters, ``first``
    elements) are copied to the host: the largest one's :func:`.offload_reduce_moment`."""
    largest = filled = 0
    for numel in reversed(numels):
        if filled >= first:
            break
        filled += numel
        largest = max(largest, numel)
    part = recorded.get("partition_elements", 0)
    return offload_reduce_moment(largest, s.param_bytes, part, s.reduce_bucket_size, s.stage)


def _early_backward(
    workload: Workload,
    s: Settings,
    trained: tuple[TrainedParams, int, int],
    recorded: Mapping[str, int],
    phases: Mapping[str, Phase],
) -> Contribution:
    """The backward phase's worst moment can come early: when the first gradient bucket is reduced, most saved
    activations are still alive beside the buckets (and, from then on, ZeRO-2's gradient partition).

    Used when backward reduces more than one bucket (with one bucket the reduction happens at the end, after the
    activations are gone). The activations still alive are taken in proportion to the parameters whose gradients
    have not arrived yet (``1 - first bucket / Ψ``); what that moment holds beyond the backward phase's end is
    added to its activations (``details["early_backward_activations"]``). ``trained``: the model as trained (gradients
    arrive for its trainable parameters only), the activations it saved, and what the first recomputed layer's
    moment holds beyond the phase (:mod:`.first_recompute`): the larger of the two moments is added. ZeRO-3's start
    of backward, where the parameters forward kept gathered are alive, is a third (:mod:`.stage3_backward`).
    """
    params, saved, checkpoints = trained
    start = 0 if workload.model.is_bare else stage3_start_extra(workload, s, params, saved, recorded)
    extra = max(_first_bucket_extra(workload, s, trained, recorded, phases), start)
    if extra < checkpoints or not extra:
        return _first_recompute(checkpoints)
    out = detail("stage3_backward_start", start) if start else NOTHING
    return out + detail("early_backward_activations", extra) + held("gpu", "activations", extra, BACKWARD)


def _first_bucket_extra(
    workload: Workload,
    s: Settings,
    trained: tuple[TrainedParams, int, int],
    recorded: Mapping[str, int],
    phases: Mapping[str, Phase],
) -> int:
    """What the first bucket's reduction holds beyond the backward phase (:func:`_early_backward`); 0 where backward
    reduces one bucket only."""
    model, elem = workload.model, s.param_bytes
    params, saved, _ = trained
    offload = s.offload_optimizer != "none"
    if model.is_bare or s.stage not in (2, 3) or (offload and s.stage == 3) or not s.reduce_scatter:
        return 0
    chunks = bucket_chunks(params.trainable, s.reduce_bucket_size)
    total = params.n_trainable
    if len(chunks) < 2 or not total:
        return 0
    alive = saved * (total - chunks[0]) // total
    first = elem * chunks[0]
    if offload:  # ZeRO-2 offload: the first gradients copied to the host, their norm's fp64 copy beside them
        early = alive + _first_offload_reduce(params.trainable, chunks[0], s, recorded)
        extra = max(0, early - recorded.get("offload_reduce", 0))
    else:
        if s.stage == 2:  # the partition (already in the phase) is allocated right after the first bucket's reduction
            partition = phases["backward"].gpu["gradients"]
            early = alive + max(first, partition) - partition
        else:  # ZeRO-3: the first bucket's reduce-scatter staging beside the permanent partition (gloo: twice)
            early = alive + first * (2 if workload.cluster.device == "cpu" else 1)
        # the phase's other moments (the reduction's copy, Muon's update at backward's end): the larger one counts
        extra = max(0, early - recorded.get("reduce_copy", 0) - recorded.get("muon_update", 0))
    return extra


def _first_recompute(extra: int) -> Contribution:
    """The other layers' checkpoints beside the first recomputed layer, held in backward (:mod:`.first_recompute`)."""
    return (
        detail("first_recompute_checkpoints", extra) + held("gpu", "activations", extra, BACKWARD) if extra else NOTHING
    )
