"""The estimator's view of one trial on one workload: :class:`Settings`, every value the memory and throughput
models read, resolved once by :func:`resolve`.

The ds_config itself is read by :class:`tuner.workload.TrialConfig` (its typed section views); this module adds what
depends on the workload (the ranks, the device, the model as trained) and refuses what the estimator does not model,
naming the key. Pure Python and fast (the tuner resolves tens of thousands of configs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tuner.estimator.memo import memo_of
from tuner.workload import (
    ACCUM_KEY,
    GLOBAL_KEY,
    MICRO_KEY,
    BatchSizes,
    ConfigError,
    Numerics,
    ParallelLayout,
    Ranks,
    TrialConfig,
    Workload,
    check_layout,
    check_long_context,
    resolve_batch,
)
from tuner.workload.autocast import autocast_dtype
from tuner.workload.config_values import content_key
from tuner.workload.numerics import LIGER_KEY

FP32 = 4  # bytes per fp32 element: masters, Adam moments, upcasts
NUMERICS_FIELDS = tuple(item.name for item in fields(Numerics))  # bf16_master, bf16_optimizer_states, muon...
ADAM_FAMILY = frozenset({"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "onebitadam", "zerooneadam"})


@dataclass(frozen=True)  # no slots: resolve fills an instance's dict at once (:func:`_filled`)
class Settings:
    """Everything the estimator needs from workload + trial config, resolved and validated: the one place a trial's
    micro-batch, accumulation and activation checkpointing are read."""

    world_size: int
    micro_batch: int
    grad_accum: int
    global_batch: int  # samples per optimizer step: micro × accumulation × the data-parallel ranks
    precision: str
    stage: int
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_bucket_size: int
    allgather_bucket_size: int
    offload_optimizer: str
    offload_optimizer_pin: bool
    offload_optimizer_buffer_count: int
    offload_param: str
    offload_param_pin: bool
    offload_param_buffer_count: int
    offload_param_buffer_size: int
    max_live_parameters: int
    max_reuse_distance: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    model_persistence_threshold: int
    sub_group_size: int
    layout: ParallelLayout  # Ulysses, AutoTP and AutoEP degrees and the hpZ group, as the config sets them
    ranks: Ranks  # the groups the ranks form (:class:`tuner.workload.Ranks`): ZeRO's, the layouts', the communicators
    round_robin_gradients: bool = False
    memory_efficient_linear: bool = True
    gather_16bit_on_save: bool = False
    quantized_weights: bool = False  # qwZ (zero_quantized_weights, ZeRO-3, CUDA only)
    quantized_gradients: bool = False
    quantized_nontrainable: bool = False  # zero_quantized_nontrainable_weights (ZeRO-3 only, CUDA only)
    expandable_segments: bool = False
    optimizer_impl: str = "fused"  # which Adam DeepSpeed builds (:func:`optimizer_impl`)
    reduce_scatter: bool = True
    multi_rank_bucket_allreduce: bool = True
    activation_checkpointing: bool = False
    tiled_mlp_shards: int = 1  # ALST's pieces (tuner.workload.LongContext)
    tiled_loss_shards: int = 1
    offload_checkpoints: bool = False
    bf16_master: bool = False  # bf16.bf16_master_weights_and_grads (tuner.workload.Numerics)
    bf16_optimizer_states: bool = False
    muon: bool = False  # optimizer.type "muon": Muon for the matrices, Adam for the rest (.muon)
    chunked_loss: bool = False  # dstune.chunked_loss: DeepSpeed's chunked cross-entropy (.chunked_loss)
    liger: bool = False  # dstune.liger_kernel: Liger-Kernel's fused kernels and loss (.liger)
    autocast: str = ""  # torch_autocast's dtype (bf16, fp16), "" without (tuner.workload.autocast)

    @property
    def param_bytes(self) -> int:
        """Bytes per element of the parameters DeepSpeed trains (16-bit or fp32)."""
        return FP32 if self.precision == "fp32" else 2

    @property
    def zero_ranks(self) -> int:
        """Ranks ZeRO partitions the model states over: every rank under Ulysses (DeepSpeed's ``seq_dp_world_size``
        is sp × dp), ``world / tp`` under AutoTP (its mpu's data-parallel group: each tensor-parallel rank holds its own
        shard of the sharded Linears, :mod:`.layouts.autotp`)."""
        return self.ranks.zero_partition

    @property
    def reduce_bytes(self) -> int:
        """Bytes per element of the gradients ZeRO reduces: under Ulysses DeepSpeed 0.19.8 reduces them in fp32
        (``seq_parallel_communication_data_type``, :attr:`tuner.workload.LongContext.communication_dtype`), so the
        reduce bucket holds fp32 elements; otherwise the training dtype."""
        return FP32 if self.ranks.sequence > 1 else self.param_bytes


SETTINGS_FIELDS = len(fields(Settings))


def resolve(workload: Workload, trial: TrialConfig | Mapping[str, Any]) -> Settings:
    """Resolve the memory-relevant settings of a trial config (or a bare ds_config: no checkpointing) for
    ``workload``. Batch sizes follow DeepSpeed's rules over the layout's data-parallel ranks
    (:meth:`tuner.workload.TrialConfig.batch_sizes`); the layout is checked (:func:`_check`). A malformed or
    unsupported value raises :class:`ConfigError` naming its key.

    A search varies the batch keys across configs that agree on everything else: the rest of a trial is read and
    checked once per workload (:func:`_kept`), and each config then resolves only its batch sizes.
    """
    config, checkpointing = (
        (trial.ds_config, trial.activation_checkpointing) if isinstance(trial, TrialConfig) else (trial, False)
    )
    key = content_key(config, skip=BATCH_CONFIG_KEYS)
    found = _kept(workload).get((bool(checkpointing), key)) if key is not None else None
    if found is None:
        settings = _resolved(workload, trial)
        if key is not None:
            _keep(workload, (bool(checkpointing), key), settings)
        return settings
    rest, data_parallel = found
    return _batched(workload.cluster.world_size, resolve_batch(config, data_parallel), rest)


BATCH_CONFIG_KEYS = frozenset({GLOBAL_KEY, MICRO_KEY, ACCUM_KEY})  # what a trial's kept settings leave out
PER_TRIAL_FIELDS = ("world_size", "micro_batch", "grad_accum", "global_batch")  # Settings' first four: not kept
MAX_KEPT = 65_536  # trials kept per workload; the oldest half is dropped beyond
_KEPT = "resolved trials"  # the per-workload memo's entry


def _kept(workload: Workload) -> dict[tuple[bool, tuple[Any, ...]], tuple[dict[str, Any], int]]:
    """The trials of ``workload`` resolved so far, keyed by activation checkpointing and the ds_config's content
    without its batch keys: their settings but the per-trial fields, and the data-parallel ranks the batch is over."""
    memo = memo_of(workload)
    kept = memo.get(_KEPT)
    if kept is None:
        kept = memo[_KEPT] = {}
    return kept


def _keep(workload: Workload, key: tuple[bool, tuple[Any, ...]], settings: Settings) -> None:
    """Keep ``settings`` but its per-trial fields under ``key`` among ``workload``'s trials, dropping the oldest half
    of them when full."""
    kept = _kept(workload)
    if len(kept) >= MAX_KEPT:
        for old in list(kept)[: MAX_KEPT // 2]:
            kept.pop(old, None)  # another thread may have dropped it
    rest = {name: value for name, value in settings.__dict__.items() if name not in PER_TRIAL_FIELDS}
    kept[key] = rest, settings.ranks.data_parallel


def _batched(world_size: int, batch: BatchSizes, rest: dict[str, Any]) -> Settings:
    """The :class:`Settings` of a kept trial (``rest``) with this config's batch sizes, its instance dict filled in
    the fields' order (as :func:`_filled` leaves it)."""
    settings = object.__new__(Settings)
    values = settings.__dict__
    values["world_size"], values["micro_batch"], values["grad_accum"], values["global_batch"] = world_size, *batch
    values.update(rest)
    return settings


def _resolved(workload: Workload, trial: TrialConfig | Mapping[str, Any]) -> Settings:
    """:func:`resolve`, read and checked from the whole trial."""
    trial = _trial_of(trial)
    batch, precision = trial.batch_sizes(workload.cluster.world_size), trial.precision
    _check(workload, trial, precision)
    zero, layout, context = trial.zero, trial.layout, trial.long_context
    values = dict(
        world_size=workload.cluster.world_size,
        micro_batch=batch.micro,
        grad_accum=batch.accum,
        global_batch=batch.total,
        precision=precision,
        stage=zero.stage,
        overlap_comm=zero.overlap_comm,
        contiguous_gradients=zero.contiguous_gradients,
        reduce_bucket_size=zero.reduce_bucket_size,
        allgather_bucket_size=zero.allgather_bucket_size,
        offload_optimizer=zero.offload_optimizer.device,
        offload_optimizer_pin=zero.offload_optimizer.pin_memory,
        offload_optimizer_buffer_count=zero.offload_optimizer.buffer_count,
        offload_param=zero.offload_param.device,
        offload_param_pin=zero.offload_param.pin_memory,
        offload_param_buffer_count=zero.offload_param.buffer_count,
        offload_param_buffer_size=zero.offload_param.buffer_size,
        max_live_parameters=zero.max_live_parameters,
        max_reuse_distance=zero.max_reuse_distance,
        prefetch_bucket_size=zero.prefetch_bucket_size,
        param_persistence_threshold=zero.param_persistence_threshold,
        model_persistence_threshold=zero.model_persistence_threshold,
        sub_group_size=zero.sub_group_size,
        layout=layout,
        ranks=trial.ranks(workload.cluster.world_size, workload.cluster.gpus_per_node),
        round_robin_gradients=zero.round_robin_gradients,
        memory_efficient_linear=zero.memory_efficient_linear,
        gather_16bit_on_save=zero.gather_16bit_on_save,
        quantized_weights=zero.quantized_weights,
        quantized_gradients=zero.quantized_gradients,
        quantized_nontrainable=_quantized_nontrainable(zero.quantized_nontrainable, zero.stage, workload),
        expandable_segments=trial.expandable_segments,
        optimizer_impl=optimizer_impl(trial, workload.cluster.device),
        reduce_scatter=zero.reduce_scatter,
        multi_rank_bucket_allreduce=zero.multi_rank_bucket_allreduce,
        activation_checkpointing=bool(trial.activation_checkpointing),
        tiled_mlp_shards=context.tiled_mlp_shards,
        tiled_loss_shards=context.tiled_loss_shards,
        offload_checkpoints=context.offload_checkpoints,
        **{name: getattr(trial.numerics, name) for name in NUMERICS_FIELDS},  # not asdict: it deep-copies each
        autocast=autocast_dtype(trial.ds_config, workload.cluster.device),
    )
    return _filled(values)


def _filled(values: dict[str, Any]) -> Settings:
    """The :class:`Settings` of ``values``, one for each field, its instance dict filled at once: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, a fifth of :func:`resolve`'s time."""
    if len(values) != SETTINGS_FIELDS:
        raise TypeError(f"Settings takes {SETTINGS_FIELDS} values, {len(values)} given")
    settings = object.__new__(Settings)
    settings.__dict__.update(values)
    return settings


def _trial_of(trial: TrialConfig | Mapping[str, Any]) -> TrialConfig:
    """The trial config of ``trial`` (a bare ds_config: no checkpointing).

    Raises:
        ConfigError: ``trial`` or its ds_config is not a JSON object.
    """
    if not isinstance(trial, (TrialConfig, Mapping)):
        raise ConfigError("ds_config", "must be a JSON object")
    trial = TrialConfig.of(trial)
    if not isinstance(trial.ds_config, dict):
        raise ConfigError("ds_config", "must be a JSON object")
    return trial


def _check(workload: Workload, trial: TrialConfig, precision: str) -> None:
    """Refuse what the estimator does not model and the layouts DeepSpeed refuses (:func:`tuner.workload.
    check_long_context`, :func:`tuner.workload.check_layout`), naming the key."""
    _refuse_unmodelled(trial, precision)
    ranks = trial.ranks(workload.cluster.world_size)  # the layout's groups (sequence, tensor, expert)
    _refuse_unmodelled_tp(trial, ranks, workload)
    _refuse_unmodelled_ep(trial, ranks, workload)
    _refuse_unmodelled_numerics(trial, ranks, workload)
    check_long_context(workload, trial)
    check_layout(workload, trial)
    _check_trainable_dtypes(trial.zero.stage, precision, workload)


OPTIMIZER_IMPLS = ("fused", "cpu_adam", "torch_single", "torch_foreach", "torch_fused")


def optimizer_impl(trial: TrialConfig, device: str) -> str:
    """The Adam implementation DeepSpeed 0.19 builds (``engine.get_optimizer_configuration``) on ``device``.

    ``torch_adam: true`` gives ``torch.optim.AdamW``: ``fused`` or ``foreach`` as its params say, else torch's own
    default (foreach on CUDA, the single-tensor loop on CPU, ``_default_to_fused_or_foreach``); otherwise optimizer
    offload gives ``DeepSpeedCPUAdam`` and everything else ``FusedAdam``. FusedAdam and CPU-Adam step in place; torch's
    single-tensor loop builds two temporaries the size of each parameter, foreach one list the size of them all.
    """
    params = trial.optimizer_params
    if not params.get("torch_adam"):
        return "cpu_adam" if trial.zero.offload_optimizer.on else "fused"
    if params.get("fused"):
        return "torch_fused"
    foreach = params.get("foreach")
    if foreach is None:
        foreach = device == "cuda"
    return "torch_foreach" if foreach else "torch_single"


def _quantized_nontrainable(on: bool, stage: int, workload: Workload) -> bool:
    """``zero_quantized_nontrainable_weights`` at ZeRO-3 (DeepSpeed ignores it at other stages); refused on CPU
    ranks: DeepSpeed's ``CUDAQuantizer`` loads a CUDA kernel (``QuantizerBuilder``)."""
    key = "zero_quantized_nontrainable_weights"
    on = on and stage == 3
    if on and workload.cluster.device != "cuda":
        raise ConfigError(f"zero_optimization.{key}", "needs CUDA (DeepSpeed's CUDA quantizer): estimate only there")
    if on and workload.trainable.quantization:
        raise ConfigError(f"zero_optimization.{key}", "not with a 4-bit bitsandbytes base (already quantized)")
    return on


def _check_trainable_dtypes(stage: int, precision: str, workload: Workload) -> None:
    """Refuse ZeRO-3 over trainable parameters of more than one dtype: DeepSpeed 0.19.8's stage-3 optimizer
    flattens them into one buffer (``defragment`` asserts a single dtype). peft keeps its LoRA adapters fp32 beside
    a 16-bit base, and ``modules_to_save`` copies keep the base's dtype: measured, the ranks fail in
    ``deepspeed.initialize`` (``bench/peft_memory.py``)."""
    profile = workload.profile
    if stage != 3 or precision == "fp32" or profile is None or workload.trainable.is_full:
        return
    dtypes = {dtype for dtype, train in zip(profile.param_dtypes, profile.trainable, strict=False) if train}
    if len(dtypes) > 1:
        raise ConfigError(
            "zero_optimization.stage",
            f"ZeRO-3 needs every trainable parameter in one dtype (DeepSpeed's stage-3 optimizer asserts it); "
            f"this model as trained has {' and '.join(sorted(dtypes))} ones (peft's adapters beside "
            f"modules_to_save copies): use ZeRO 0-2, or cast the adapters to the training dtype",
        )


def _refuse_unmodelled(trial: TrialConfig, precision: str) -> None:
    """Refuse what DeepSpeed trains but the estimator does not model (yet), naming the key."""
    kind = trial.optimizer_type
    if not isinstance(kind, str) or kind.lower() not in ADAM_FAMILY | {"muon"}:
        raise ConfigError("optimizer.type", f"the estimator models Adam-family optimizers and Muon, got {kind!r}")
    if trial.grad_accum_dtype not in (None, precision):
        raise ConfigError(
            "data_types.grad_accum_dtype",
            "a gradient accumulation dtype other than the model's is not modelled by the estimator yet",
        )


def _refuse_unmodelled_tp(trial: TrialConfig, ranks: Ranks, workload: Workload) -> None:
    """AutoTP needs the model's shapes (which Linears it shards); with an adapter or frozen parameters, with Ulysses
    or with TiledMLP the estimator does not model it yet (LoRA's shards, heads over sp × tp, f/tp-wide tiles)."""
    if ranks.tensor <= 1:
        return
    if workload.model.is_bare:
        raise ConfigError("tensor_parallel.autotp_size", "AutoTP needs the model's shapes, not a bare parameter count")
    if not workload.trainable.is_full:
        raise ConfigError(
            "tensor_parallel.autotp_size",
            "AutoTP with a peft adapter or frozen parameters is not modelled by the estimator yet",
        )
    if ranks.sequence > 1:
        raise ConfigError("tensor_parallel.autotp_size", "AutoTP with Ulysses is not modelled by the estimator yet")
    if trial.long_context.tiled_mlp_shards > 1:
        raise ConfigError("dstune.tiled_mlp_shards", "TiledMLP with AutoTP is not modelled by the estimator yet")


def _refuse_unmodelled_ep(trial: TrialConfig, ranks: Ranks, workload: Workload) -> None:
    """AutoEP needs the model's shapes (which weights are experts); with an adapter or frozen parameters, with Ulysses
    or with TiledMLP the estimator does not model it yet."""
    if ranks.expert <= 1:
        return
    key = "expert_parallel.autoep_size"
    if workload.model.is_bare:
        raise ConfigError(key, "AutoEP needs the model's shapes, not a bare parameter count")
    if not workload.trainable.is_full:
        raise ConfigError(key, "AutoEP with a peft adapter or frozen parameters is not modelled by the estimator yet")
    if ranks.sequence > 1:
        raise ConfigError(key, "AutoEP with Ulysses is not modelled by the estimator yet")
    if trial.long_context.tiled_mlp_shards > 1:
        raise ConfigError("dstune.tiled_mlp_shards", "TiledMLP with AutoEP is not modelled by the estimator yet")


def _refuse_unmodelled_numerics(trial: TrialConfig, ranks: Ranks, workload: Workload) -> None:
    """The chunked loss replaces the model's own loss (not a tiled loss or Ulysses' loss, which are their own).
    Muon is estimated at ZeRO-1/2 on the whole model (its Muon/Adam split is read from the model's shapes), without
    optimizer offload, AutoTP or AutoEP."""
    numerics, context = trial.numerics, trial.long_context
    if numerics.chunked_loss and (context.tiled_loss_shards > 1 or ranks.sequence > 1):
        raise ConfigError("dstune.chunked_loss", "not with a tiled loss or Ulysses: their loss is their own")
    if numerics.liger and workload.cluster.device != "cuda":
        raise ConfigError(LIGER_KEY, "Liger's kernels need Triton on a CUDA GPU: not on CPU ranks")
    if numerics.liger and context.tiled_loss_shards > 1:
        raise ConfigError(LIGER_KEY, "not with a tiled loss: Liger's fused linear cross-entropy is the loss")
    if not numerics.muon:
        return
    key = "optimizer.type"
    if trial.zero.offload_optimizer.on:
        raise ConfigError(key, "Muon with optimizer offload is not modelled by the estimator yet")
    if not workload.trainable.is_full:
        raise ConfigError(key, "Muon with a peft adapter or frozen parameters is not modelled by the estimator yet")
    if ranks.tensor > 1 or ranks.expert > 1:
        raise ConfigError(key, "Muon with AutoTP or AutoEP is not modelled by the estimator yet")


__all__ = ["ADAM_FAMILY", "FP32", "OPTIMIZER_IMPLS", "ConfigError", "Settings", "optimizer_impl", "resolve"]
