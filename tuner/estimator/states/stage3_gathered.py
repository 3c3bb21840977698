"""The whole parameters ZeRO-3 holds beside its shards: persistent ones, those kept gathered after the forward pass,
the module being gathered (and the prefetch bucket), and the whole 16-bit model a ``save`` gathers.

ZeRO-3 keeps parameters of at most ``stage3_param_persistence_threshold`` elements whole on every rank and gathers
the rest on the fly. After the forward pass it still holds the gathered parameters it will reuse within
``stage3_max_reuse_distance`` (with the default, 1e9, every parameter backward reuses);
``stage3_max_live_parameters`` bounds the prefetch only. With ``stage3_gather_16bit_weights_on_model_save`` the
estimate has a fourth phase, ``save`` (:func:`save_phase`): saving the model gathers the whole 16-bit model on rank 0.
"""

from __future__ import annotations

from tuner.estimator.layouts.zeropp import qwz_staging_bytes
from tuner.estimator.settings import Settings
from tuner.estimator.states.partitions import Stage3Partition, stage3_layout
from tuner.estimator.states.quantized import quantized_base
from tuner.estimator.states.trainable import TrainedParams, frozen_lead, trained_params
from tuner.estimator.terms import Contribution, detail, held
from tuner.workload import Workload


def stage3_gathered(workload: Workload, params: TrainedParams, part: Stage3Partition, s: Settings) -> Contribution:
    """Whole parameters ZeRO-3 holds beside the shards ``part`` of ``params`` (on one rank the shard is the whole,
    so nothing: the caller adds them on more ranks only).

    Backward revisits every parameter but those of modules it never runs (a LoRA model's frozen embedding, released
    after use; a tied embedding is the LM head too, which backward does run). Persistent parameters stay whole
    through forward and backward; the step repartitions everything. Once a step has recorded the order modules run
    in (a complete trace, from the second step on), DeepSpeed keeps after the forward pass the gathered parameters it
    will reuse within ``stage3_max_reuse_distance`` (backward starts with the last layers); backward releases them
    module by module, so none is left by its last reduction (:func:`.stage3_reduce_copy`). While a module runs, it
    and the prefetch bucket are gathered too: that working set is transient (``stage3_working_set``).
    ``stage3_max_live_parameters`` does not cap what is kept: in DeepSpeed 0.19.8 it bounds the prefetch only
    (``PartitionedParameterCoordinator.fetch_sub_module``: at most ``max_live - available`` more elements), and
    the release (``__params_to_release``) asks the reuse distance alone (:func:`kept_after_forward`). Measured
    (``bench/precision_true_peak.py``, a small LLaMA of 5.2M elements at ZeRO-3 with ``stage3_max_live_parameters``
    of 500,000, 2 CPU ranks): every non-persistent parameter, 4,456,448 elements, is gathered at the loss's
    backward, where the peak is; with ``stage3_max_reuse_distance`` 3,000,000 the LM head and the last layer's MLP,
    1,638,400 elements (both peaks within 0.01 %).

    Measured on 2 CPU ranks with the counting allocator (both ranks' peaks agree to the byte): LoRA on a tiny
    Mixtral-shaped MoE with small buckets peaks in the loss's backward holding every expert stack and the LM head
    gathered (DeepSpeed's own parameter states at that moment: 1,703,936 elements ``AVAILABLE``); the 100M-parameter
    models with one bucket hold none of them at their backward peak. transformers 5 fuses an MoE's experts into one
    module that runs every step, so its module order is as static as a dense model's.

    With experts that are modules of their own (:func:`_expert_modules`, run only for the tokens routed to them) the
    module order changes every step: DeepSpeed drops its trace and releases each module's parameters after use
    (``release_sub_module`` without a complete trace), so forward keeps nothing (read in DeepSpeed's code, not
    measured here).
    """
    elem, largest, persistent = s.param_bytes, part.largest, part.persistent
    _, persists = stage3_layout(
        params.numels, s.zero_ranks, s.param_persistence_threshold, s.model_persistence_threshold
    )
    tied = workload.model.tie_embeddings
    unused = 0 if tied else frozen_lead(params, persists)
    unpartitioned = params.n_params - unused - persistent
    skipped = 0 if tied or params.is_full else params.mask.index(True) if True in params.mask else len(params.mask)
    kept = kept_after_forward(params.numels, persists, s.max_reuse_distance, tied, skipped)
    if _expert_modules(workload):
        kept = 0
    gathering = min(unpartitioned, largest + s.prefetch_bucket_size)
    working = max(0, gathering - kept)
    out = (
        *held("gpu", "parameters", elem * persistent, ("forward", "backward")),
        *detail("gathered_parameters", elem * kept),
        *detail("stage3_working_set", elem * working),
        *held("gpu", "parameters", elem * kept, ("forward",)),
        *held("gpu", "buffers", elem * working, ("forward",)),
    )
    if s.quantized_weights:  # qwZ: the set being gathered arrives as int8 with its scales (:mod:`.layouts.zeropp`)
        staging = qwz_staging_bytes(gathering)
        out += detail("qwz_staging", staging) + held("gpu", "buffers", staging, ("forward",))
    return out


def kept_after_forward(
    numels: tuple[int, ...], persists: tuple[bool, ...], reuse_distance: int, tied: bool, skipped: int = 0
) -> int:
    """Elements of the gathered (not persistent) parameters, in model order, that the forward pass leaves gathered
    for backward (never the first ``skipped``: frozen ones before the first trainable, whose modules backward does
    not run, :func:`.frozen_lead`): DeepSpeed's ``__params_to_release`` keeps a module's parameters when they
    reappear in the recorded module order before ``reuse_distance`` elements were traversed, and from a parameter's
    forward use to its backward one lie the parameters after it twice (the rest of forward, then backward's first
    modules). A tied embedding is the LM head too: used last. ``stage3_max_live_parameters`` plays no part (it
    bounds the prefetch).

    >>> kept_after_forward((8, 2, 8), (False, True, False), 10**9, False)
    16
    >>> kept_after_forward((8, 2, 8), (False, True, False), 20, False)
    8
    >>> kept_after_forward((8, 2, 8), (False,) * 3, 0, False), kept_after_forward((8, 2, 8), (False,) * 3, 99, False, 1)
    (0, 10)
    """
    kept, after = 0, 0
    for index in range(len(numels) - 1, -1, -1):
        last_use = 0 if tied and index == 0 else after
        if index >= skipped and not persists[index] and 2 * last_use < reuse_distance:
            kept += numels[index]
        after += numels[index]
    return kept


def _expert_modules(workload: Workload) -> bool:
    """True when the workload's model profile says its MoE experts are modules of their own, run only for the
    tokens routed to them (unknown without a profile: False, as transformers 5 fuses most MoEs' experts)."""
    profile = workload.profile
    return profile is not None and profile.expert_modules


def save_phase(workload: Workload, s: Settings) -> tuple[int, Contribution]:
    """The ``save`` phase of ZeRO-3 with ``stage3_gather_16bit_weights_on_model_save``: (the bytes gathered, its
    contribution).

    ``save_16bit_model`` calls ``_zero3_consolidated_16bit_state_dict`` (``deepspeed/runtime/engine.py:5631``) on
    every rank between steps: it gathers one module's parameters at a time (``GatheredParameters`` on every rank's
    device) and rank 0 copies each into a host ``state_dict`` (``param.detach().cpu()``), so rank 0's host ends up
    holding the whole model in the training dtype, ``e·Ψ`` (tied weights once), beside the steady state: shards,
    optimizer states, the permanent gradient partition and reduce bucket (no activations, no fp32 step gradients).
    The device adds the module being gathered (its largest parameter); on CPU ranks the gathered storages are the
    state_dict's own (``.cpu()`` copies nothing), so nothing is added beyond ``e·Ψ``. Measured on 2 CPU ranks
    (``tests/estimator/test_save_deepspeed.py``): rank 0's state_dict holds exactly ``e·Ψ`` in storages no live
    parameter shares, persistent parameters included. The phase's host bytes are rank 0's (the worst rank); on the
    node only rank 0 holds the model.
    """
    model, elem = workload.model, s.param_bytes
    gathered = elem * model.n_params
    base = quantized_base(workload, trained_params(workload))
    if base is not None:  # 4-bit weights are gathered as their packed data
        gathered += base.packed - elem * base.elements
    working = elem * model.largest_param if workload.cluster.device == "cuda" else 0
    return gathered, (
        *detail("save_gathered_model", gathered),
        *detail("save_working_set", working),
        *held("cpu", "parameters", gathered, ("save",)),
        *held("gpu", "buffers", working, ("save",)),
    )
