"""The model a rank trains: built where it trains (:mod:`tuner.measure.rank.birth`), the built-in one or the
transformers one, with its trainable part applied as the HF Trainer gets it (a peft adapter, frozen patterns)."""

from __future__ import annotations

import json
from typing import Any

from tuner.measure.measurement import InvalidConfig, RankResult
from tuner.measure.run_protocol import RunSpec
from tuner.workload import TrainableSpec, TrialConfig, Workload
from tuner.workload.layouts import ULYSSES


def trained_model(spec: RunSpec, workload: Workload, result: RankResult) -> Any:
    """Build the model sharded (ZeRO-3) or on the device in the training dtype (``tuner.measure.rank.birth``),
    recording the resident bytes it added on the host in ``result``, then make its trainable part
    (:func:`_with_trainable`)."""
    from tuner.measure.rank.birth import born_on_device, initialise_partitioned, rss_bytes

    rss = result.rss_bytes
    rss["before_model"] = rss_bytes()
    transformers = workload.model.implementation == "transformers"
    if not workload.trainable.is_full and not transformers:
        field = "peft" if workload.trainable.peft else "freeze"
        raise ValueError(f"{field}: needs the transformers model (model_impl transformers), not the built-in one")
    with born_on_device(spec.trial.deepspeed_config(workload.cluster.world_size), spec.device, transformers):
        model = _build_model(workload, spec.activation_checkpointing)
    initialise_partitioned(model)  # the base model's weights, before the adapter is added (lora_B stays zero)
    model = _with_trainable(model, workload.trainable, result)
    rss["after_model"] = rss_bytes()
    return model


def _with_trainable(model: Any, trainable: TrainableSpec, result: RankResult) -> Any:
    """The transformers model with its adapter added and its freeze pattern applied (``apply_trainable``), as
    the HF Trainer gets it: after the base model is built, outside ``zero.Init``. Under ZeRO-3 the adapter's
    parameters are then ordinary tensors until ``deepspeed.initialize`` partitions them (DeepSpeedZeRoOffload
    converts every parameter without a ``ds_id``; peft keeps them fp32, which ZeRO-3 leaves as is while ZeRO-0-2
    cast the whole module to the training dtype). Records how many parameters train (``ds_numel``: ZeRO-3's
    parameters are empty until gathered)."""
    if trainable.is_full:
        return model
    from tuner.profile.trainable import apply_trainable

    model.model = apply_trainable(model.model, trainable)
    params = list(model.parameters())
    result.trainable_params = sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)
    return model


def _build_model(workload: Workload, checkpointing: bool) -> Any:
    """The model as ``workload`` names it (not yet trainable-filtered), in the current device and dtype context."""
    train = workload.train
    if workload.model.implementation == "transformers":
        from tuner.measure.rank.models import build_transformers_model

        return build_transformers_model(json.loads(workload.model.hf_config), train.attention, checkpointing)
    from tuner.measure.rank.models import build_model

    return build_model(workload.model, attention=train.attention, checkpointing=checkpointing)


def long_context_model(trial: TrialConfig, workload: Workload, model: Any, result: RankResult) -> tuple[Any, Any]:
    """``model`` as the trial's layout and long-context settings train it, and the rank's
    :class:`~tuner.measure.rank.layouts.ulysses.SequenceShard` (its mpu goes to ``deepspeed.initialize``): Ulysses
    registered for sp > 1, tiled MLPs, checkpoint offload, the
    :class:`~tuner.measure.rank.layouts.ulysses.LongContextLM` loss for sequence parallelism or a tiled loss, and the
    transformers ``tp_plan`` exposed on what DeepSpeed is handed for AutoTP (:mod:`tuner.measure.rank.layouts.autotp`).
    What cannot be measured is refused (:func:`~tuner.measure.long_context_checks.measured_refusal`, as
    ``invalid_config``)."""
    import torch.distributed as dist

    from tuner.measure.layout_checks import with_tp_split
    from tuner.measure.long_context_checks import measured_refusal
    from tuner.measure.rank.layouts.ulysses import LongContextLM, join_sequence_parallel

    refusal = measured_refusal(with_tp_split(workload, trial), trial, workload.cluster.device)
    if refusal is not None:
        raise InvalidConfig(f"{refusal[0]}: {refusal[1]}")
    sizes, context, sp = trial.batch_sizes(dist.get_world_size()), trial.long_context, trial.layout.degree(ULYSSES)
    ranks, rank = trial.layout.ranks(dist.get_world_size()).checked(), dist.get_rank()
    dp_rank = ranks.place(rank).data_parallel  # a sequence- or tensor-parallel group's ranks share a sample
    hf_model = getattr(model, "model", None)  # dstune's own models have none: sp 1, Ulysses does not use it
    shard = join_sequence_parallel(hf_model, sp, sizes.micro, workload.train.seq_len, dp_rank)
    result.layout = shard.layout(ranks.data_parallel)
    if ranks.tensor > 1:
        from tuner.measure.rank.layouts.autotp import place

        result.layout.update(place(ranks, rank))
    if ranks.expert > 1:
        from tuner.measure.rank.layouts.autoep import place as expert_place

        result.layout.update(expert_place(ranks, rank))
    if context.tiled_mlp_shards > 1:
        from tuner.measure.rank.layouts.alst import tile_mlps

        tile_mlps(model.model, context.tiled_mlp_shards)
    if context.offload_checkpoints:
        from tuner.measure.rank.layouts.alst import offload_checkpoints

        offload_checkpoints(model.model)
    if trial.numerics.chunked_loss:
        from tuner.measure.rank.chunked_loss import use_chunked_loss

        use_chunked_loss(model)
    transformers_model = getattr(model, "model", None)
    if sp > 1 or context.tiled_loss_shards > 1:
        model = LongContextLM(model, shard, trial.stage, context.tiled_loss_shards, sizes.accum)
    if ranks.tensor > 1:
        from tuner.measure.rank.layouts.autotp import expose_tp_plan

        expose_tp_plan(model, transformers_model)
    return model, shard


def rank_batches(
    trial: TrialConfig, workload: Workload, shard: Any, seeded: list[Any], device: Any, result: RankResult
) -> list[Any]:
    """The rank's (tokens, targets) per micro-step, from its data feeder's ``seeded`` batches
    (:func:`tuner.measure.rank.numerics.seeded_batches`): as they are, or, when the model is a
    :class:`~tuner.measure.rank.layouts.ulysses.LongContextLM`, this rank's share of each sample's sequence (its input
    ids and shifted labels); records the tokens a rank trains on per micro-batch (s/sp × micro-batch)."""
    from tuner.measure.rank.layouts.ulysses import shard_batch

    sharded = trial.layout.degree(ULYSSES) > 1 or trial.long_context.tiled_loss_shards > 1
    batches = [shard_batch(tokens, shard) if sharded else (tokens, targets) for tokens, targets in seeded]
    micro, seq_len = seeded[0][0].shape
    result.tokens_per_micro_batch = micro * seq_len // shard.size
    return [tuple(part.to(device) for part in pair) for pair in batches]
