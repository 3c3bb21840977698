"""What the search decides for one trial: :class:`TrialConfig`, the ds_config plus activation checkpointing.

What is trained (model, cluster, sequence length, precision, attention, optimizer, trainable part) is the
:class:`tuner.workload.Workload`; how it is trained is a :class:`TrialConfig`, and it is the one place that reads a
ds_config's sections: the batch sizes (by DeepSpeed's rules, over the data-parallel ranks of the layout), the
precision, ``zero_optimization`` (:class:`~tuner.workload.zero.ZeroConfig`), the parallel layout
(:class:`~tuner.workload.layout.ParallelLayout`), the optimizer and dstune's own ``dstune`` section. The estimator,
the space, the study, the runner, the recommender, the exports, the API and the dashboard all read these typed,
read-only views; nothing else parses a ds_config. Pure Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tuner.workload.config_values import ConfigError, enabled, read_bool, section
from tuner.workload.layout import ParallelLayout
from tuner.workload.long_context import LongContext
from tuner.workload.numerics import Numerics
from tuner.workload.ranks import Ranks
from tuner.workload.views import cached_property
from tuner.workload.zero import ZeroConfig

MICRO_KEY = "train_micro_batch_size_per_gpu"
ACCUM_KEY = "gradient_accumulation_steps"
GLOBAL_KEY = "train_batch_size"
BATCH_KEYS = (MICRO_KEY, ACCUM_KEY)
DEFAULT_MICRO = DEFAULT_ACCUM = 1  # what a config that leaves them open trains with
MAX_BATCH = 2**31  # samples: beyond any real global batch (and what the schema's micro-batch × ranks allows)
ENV_SECTION = "dstune"  # a top-level section DeepSpeed ignores: settings dstune applies to the run itself
PRECISION_SECTIONS = {"bf16": "bf16", "fp16": "fp16"}


class BatchSizes(NamedTuple):
    """Micro-batch per rank, accumulation steps and the global batch (samples per optimizer step)."""

    micro: int
    accum: int
    total: int


def accumulation_for(global_batch: int, micro: int, data_parallel: int) -> int:
    """Accumulation steps that make ``micro × steps × data_parallel == global_batch``.

    Raises:
        ConfigError: (``train_batch_size``) ``micro × data_parallel`` does not divide the global batch.

    Example:
        >>> accumulation_for(16, 4, 2)
        2
    """
    if global_batch % (micro * data_parallel):
        raise ConfigError(
            GLOBAL_KEY,
            f"micro-batch {micro} × world size {data_parallel} = {micro * data_parallel} does not divide "
            f"the global batch {global_batch}",
        )
    return global_batch // (micro * data_parallel)


def _batch_value(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if value == "auto":
            raise ConfigError(key, '"auto" is a Hugging Face Trainer placeholder; give a number')
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    if value > MAX_BATCH:  # no run trains 10**40 samples at once: a typo, refused early
        raise ConfigError(key, f"must be at most {MAX_BATCH}, got {value}")
    return value


def resolve_batch(config: Mapping[str, Any], data_parallel: int) -> BatchSizes:
    """DeepSpeed's batch rules: ``train_batch_size = micro × accumulation × data-parallel ranks``, any two determine
    the third; a micro-batch or accumulation the config leaves open is 1.

    Raises:
        ConfigError: a bad or inconsistent batch value, naming its key.
    """
    total, micro, accum = (_batch_value(config, key) for key in (GLOBAL_KEY, MICRO_KEY, ACCUM_KEY))
    dp = data_parallel
    if micro is None and accum is None and total is None:
        micro, accum = DEFAULT_MICRO, DEFAULT_ACCUM
    elif micro is None and total is not None:
        accum = accum or 1
        if total % (accum * dp):
            raise ConfigError(
                GLOBAL_KEY, f"{total} is not divisible by gradient_accumulation_steps × world size = {accum * dp}"
            )
        micro = total // (accum * dp)
    elif accum is None:
        micro = micro or DEFAULT_MICRO
        if total is None:
            accum = DEFAULT_ACCUM
        elif total % (micro * dp):
            raise ConfigError(GLOBAL_KEY, f"{total} is not divisible by micro-batch × world size = {micro * dp}")
        else:
            accum = total // (micro * dp)
    if micro is None:
        micro = DEFAULT_MICRO
    expected = micro * accum * dp
    if total is not None and total != expected:
        raise ConfigError(
            GLOBAL_KEY,
            f"{total} != micro-batch {micro} × gradient_accumulation_steps {accum} × world size {dp} = {expected}",
        )
    if micro <= 0 or accum <= 0:
        raise ConfigError(GLOBAL_KEY, "resolves to a batch of zero")
    return BatchSizes(micro, accum, expected)


@dataclass(frozen=True)
class TrialConfig:
    """One trial's configuration: the complete DeepSpeed config and whether the model recomputes activations.

    Attributes:
        ds_config: The DeepSpeed config: batch sizes, the precision section, ``zero_optimization``, the optimizer...
        activation_checkpointing: Whether the model's layers are checkpointed (a setting of the model, not a
            ds_config key: transformers' ``gradient_checkpointing``).

    The section views (:attr:`zero`, :attr:`layout`, :attr:`precision`...) are read on first use and kept; a bad
    value raises :class:`~tuner.workload.config_values.ConfigError` naming its key.

    Example:
        >>> trial = TrialConfig({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        ...                      "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, True)
        >>> trial.batch, trial.key == TrialConfig(dict(trial.ds_config), True).key
        ((2, 4), True)
        >>> trial.stage, trial.precision, trial.batch_sizes(world_size=4).total
        (2, 'bf16', 32)
        >>> trial.summary()
        'ZeRO-2 · micro 2 × accum 4 · bf16 · checkpointing'
    """

    ds_config: dict[str, Any] = field(default_factory=dict)
    activation_checkpointing: bool = False

    @classmethod
    def of(cls, trial: TrialConfig | Mapping[str, Any]) -> TrialConfig:
        """``trial`` itself, or a bare ds_config as a trial without activation checkpointing."""
        return trial if isinstance(trial, TrialConfig) else cls(dict(trial))

    @property
    def key(self) -> str:
        """:func:`config_key` of this config."""
        return config_key(self)

    @property
    def batch(self) -> tuple[int | None, int | None]:
        """(micro-batch, accumulation steps) as the ds_config gives them (None where it leaves one to DeepSpeed's
        rules: :meth:`batch_sizes` resolves them)."""
        return self.ds_config.get(MICRO_KEY), self.ds_config.get(ACCUM_KEY)

    def batch_sizes(self, world_size: int) -> BatchSizes:
        """Micro-batch, accumulation and global batch on ``world_size`` ranks, by DeepSpeed's rules over the
        layout's data-parallel ranks."""
        return resolve_batch(self.ds_config, self.layout.data_parallel(world_size))

    def global_batch(self, world_size: int) -> int:
        """Samples per optimizer step on ``world_size`` ranks."""
        return self.batch_sizes(world_size).total

    def with_batch(self, micro: int, accum: int, world_size: int) -> TrialConfig:
        """This trial with the micro-batch, accumulation and the global batch they make on ``world_size`` ranks."""
        batch = {MICRO_KEY: micro, ACCUM_KEY: accum, GLOBAL_KEY: micro * accum * self.layout.data_parallel(world_size)}
        rest = {key: value for key, value in self.ds_config.items() if key not in batch}
        return TrialConfig({**batch, **rest}, self.activation_checkpointing)

    @cached_property
    def precision(self) -> str:
        """``bf16``, ``fp16`` or ``fp32`` (no 16-bit section enabled; DeepSpeed still reads ``bfloat16`` as ``bf16``).

        Raises:
            ConfigError: both 16-bit sections enabled.
        """
        fp16 = enabled(self.ds_config, "fp16")
        bf16 = enabled(self.ds_config, "bf16") if "bf16" in self.ds_config else enabled(self.ds_config, "bfloat16")
        if fp16 and bf16:
            raise ConfigError("bf16.enabled", "fp16 and bf16 cannot both be enabled")
        return "fp16" if fp16 else "bf16" if bf16 else "fp32"

    @cached_property
    def zero(self) -> ZeroConfig:
        """The ``zero_optimization`` section, resolved."""
        return ZeroConfig.of(self.ds_config)

    @property
    def stage(self) -> int:
        """The ZeRO stage (0 when the config has none)."""
        return self.zero.stage

    @cached_property
    def layout(self) -> ParallelLayout:
        """Sequence, tensor and expert parallel degrees."""
        _ = self.zero  # the ZeRO section checked whole first: hpZ's group is one of its keys
        return ParallelLayout.of(self.ds_config)

    def ranks(self, world_size: int, gpus_per_node: int = 0) -> Ranks:
        """The ranks of this trial on ``world_size`` ranks, ``gpus_per_node`` a node: the layout's groups and, at
        ZeRO-3, hpZ's group and qgZ's all-to-alls (DeepSpeed makes neither at other stages).

        >>> TrialConfig({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}}).ranks(4).hpz
        1
        """
        zero = self.zero
        return self.layout.ranks(world_size, gpus_per_node, zero.stage, zero.quantized_gradients)

    @cached_property
    def long_context(self) -> LongContext:
        """ALST's tiled MLP and loss, checkpoint offload and Ulysses' communication dtype."""
        return LongContext.of(self.ds_config)

    @cached_property
    def optimizer_type(self) -> str:
        """``optimizer.type`` as given (DeepSpeed's default ``AdamW`` when absent)."""
        return section(self.ds_config, "optimizer").get("type", "AdamW")

    @cached_property
    def optimizer_params(self) -> dict[str, Any]:
        """``optimizer.params`` (empty when absent or not an object)."""
        params = section(self.ds_config, "optimizer").get("params") or {}
        return params if isinstance(params, dict) else {}

    @cached_property
    def numerics(self) -> Numerics:
        """The numerics-changing choices: bf16 master weights, bf16 optimizer states, Muon (:mod:`.numerics`)."""
        return Numerics.of(self.ds_config)

    @property
    def grad_accum_dtype(self) -> str | None:
        """``data_types.grad_accum_dtype`` as given."""
        return section(self.ds_config, "data_types").get("grad_accum_dtype")

    @cached_property
    def expandable_segments(self) -> bool:
        """Whether the run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``dstune.expandable_segments``,
        a search-space parameter; the runner applies it to CUDA runs and takes the section out before DeepSpeed)."""
        return read_bool(section(self.ds_config, ENV_SECTION), "expandable_segments", False, f"{ENV_SECTION}.")

    @cached_property
    def threads_per_rank(self) -> int | None:
        """The OpenMP threads each rank runs with (``dstune.threads_per_rank``, searched with ``--search-threads``),
        over the launch environment's rule; None: the rule decides."""
        value = section(self.ds_config, ENV_SECTION).get("threads_per_rank")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{ENV_SECTION}.threads_per_rank", f"must be a positive integer, got {value!r}")
        return value

    @cached_property
    def fault_loss_scale(self) -> float:
        """Fault injection, for tests only (``dstune.fault_loss_scale``, default 1): the runner multiplies the loss each
        rank backpropagates by it, a broken loss average that the numerics guard must catch
        (:mod:`tuner.measure.rank.numerics`)."""
        value = section(self.ds_config, ENV_SECTION).get("fault_loss_scale", 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{ENV_SECTION}.fault_loss_scale", f"must be a positive number, got {value!r}")
        return float(value)

    def deepspeed_world(self, world_size: int) -> int:
        """The ranks DeepSpeed 0.19.8's batch check counts on ``world_size`` ranks without an mpu: the world over
        the sequence-parallel degree (``DeepSpeedConfig`` divides by ``sequence_parallel_size``), tensor-parallel
        ranks included (see :meth:`deepspeed_config`).

        >>> TrialConfig({"sequence_parallel_size": 2}).deepspeed_world(8)
        4
        >>> TrialConfig({"tensor_parallel": {"autotp_size": 2}}).deepspeed_world(8)
        8
        """
        return self.layout.ranks(world_size).deepspeed_world

    def deepspeed_config(self, world_size: int | None = None) -> dict[str, Any]:
        """The ds_config DeepSpeed is handed: without dstune's own ``dstune`` section.

        Under AutoTP the global batch is left to DeepSpeed: its ``DeepSpeedConfig``, built without an mpu (as
        ``deepspeed.initialize`` builds it for a config-driven AutoTP, and as the HF Trainer's path does), checks
        ``train_batch_size`` against micro × accumulation × *every* rank, tp ranks included (DeepSpeed 0.19.8,
        measured: ``4 != 2 * 1 * 4`` for micro 2 on TP 2 × DP 2), although a tensor-parallel group trains on one
        sample: the samples per step are micro × accumulation × dp (:meth:`batch_sizes`). So with tp > 1 the
        config carries the micro-batch and the accumulation steps (resolved on ``world_size`` ranks when given)
        and no ``train_batch_size``, which DeepSpeed then derives by its own count.

        A trial of the space's degree 1 (``tensor_parallel: {autotp_size: 1}``, no AutoTP) hands DeepSpeed no
        ``tensor_parallel`` section: any ``autotp_size`` above 0 sets DeepSpeed's AutoTP training mode. Nor, for
        the space's AutoEP degree 1, an ``expert_parallel: {autoep_size: 1}`` section (AutoEP off without ``enabled``),
        nor its Ulysses degree 1 (``sequence_parallel_size: 1``, DeepSpeed's default).

        >>> TrialConfig({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        ...              "tensor_parallel": {"autotp_size": 2}}).deepspeed_config(world_size=4)
        {'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 2, 'tensor_parallel': {'autotp_size': 2}}
        >>> TrialConfig({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 1},
        ...              "sequence_parallel_size": 1}).deepspeed_config()
        {'train_batch_size': 8}
        """
        config = ParallelLayout.without_off({key: value for key, value in self.ds_config.items() if key != ENV_SECTION})
        # the degrees alone: the ZeRO section stays unread, so a key DeepSpeed rejects reaches DeepSpeed's judgement
        if ParallelLayout.of(self.ds_config, zero=False).batch_as_deepspeed_counts or GLOBAL_KEY not in config:
            return config
        if world_size is not None:
            sizes = self.batch_sizes(world_size)
            config = {MICRO_KEY: sizes.micro, ACCUM_KEY: sizes.accum, **config}
            config[MICRO_KEY], config[ACCUM_KEY] = sizes.micro, sizes.accum
        elif MICRO_KEY not in config or ACCUM_KEY not in config:
            return config  # cannot be resolved without the ranks: DeepSpeed judges it as given
        config.pop(GLOBAL_KEY)
        return config

    def summary(self) -> str:
        """One line for tables and reasons: ``ZeRO-2 · micro 4 × accum 2 · bf16 · optimizer → cpu``.

        Reads the config leniently (a malformed section is left out, never raised): it describes stored and
        refused configs too.
        """
        if not self.ds_config:
            return "(no ds_config)"
        zero = self.ds_config.get("zero_optimization")
        zero = zero if isinstance(zero, dict) else {}
        parts = [f"ZeRO-{zero.get('stage', 0)}"]
        micro, accum = self.batch
        if micro is not None:
            parts.append(f"micro {micro}" + (f" × accum {accum}" if accum is not None else ""))
        parts += [name for name in PRECISION_SECTIONS if (self.ds_config.get(name) or {}).get("enabled")]
        with contextlib.suppress(ConfigError):  # read leniently, as below
            parts += self.numerics.labels()
        for key, label in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
            device = (zero.get(key) or {}).get("device", "none")
            if device != "none":
                parts.append(f"{label} → {device}")
        for describe in (lambda: self.layout.label(), lambda: self.long_context.summary()):
            try:  # sections read leniently: a malformed one is left out
                described = describe()
            except ConfigError:
                described = ""
            if described:
                parts.append(described)
        if self.activation_checkpointing:
            parts.append("checkpointing")
        return " · ".join(parts)


def config_key(trial: TrialConfig | Mapping[str, Any], activation_checkpointing: bool = False) -> str:
    """A stable hash of a config: the ds_config plus activation checkpointing.

    Two trials with equal keys train identically, so the study runs one and reuses its result.

    Args:
        trial: A :class:`TrialConfig`, or a bare ds_config dict.
        activation_checkpointing: Used with a bare ds_config only.

    Returns:
        16 hex digits.

    Example:
        >>> config_key({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}) == config_key(
        ...     {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}})
        True
    """
    if isinstance(trial, TrialConfig):
        config, checkpointing = trial.ds_config, trial.activation_checkpointing
    else:
        config, checkpointing = dict(trial), activation_checkpointing
    payload = {"activation_checkpointing": bool(checkpointing), "ds_config": config}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "ACCUM_KEY",
    "BATCH_KEYS",
    "DEFAULT_ACCUM",
    "DEFAULT_MICRO",
    "ENV_SECTION",
    "GLOBAL_KEY",
    "MICRO_KEY",
    "BatchSizes",
    "ConfigError",
    "TrialConfig",
    "accumulation_for",
    "config_key",
    "resolve_batch",
]
