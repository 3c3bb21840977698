"""Where a trial's AutoTP and ZeRO++ settings meet the workload: what DeepSpeed 0.19 accepts, refused in one line
naming the field before any work (the Ulysses and ALST checks are :mod:`.long_context_checks`'):

- ``tensor_parallel.autotp_size`` (tp) must divide the GPUs of a node (AutoTP's all-reduces run every layer, over
  NVLink, never across nodes), the attention heads and the key-value heads (AutoTP shards q/k/v by heads; a rank
  beyond the key-value heads would hold no attention shard: DeepSpeed only warns, and that rank idles).
- AutoTP on an MoE model needs the model's ``tp_plan`` read into its profile, without styles DeepSpeed rejects:
  with transformers 5.24 Qwen2-MoE's plan had ``moe_tp_experts`` and ``packed_colwise``, which DeepSpeed refuses
  (measured); with 5.25 its plan shards the attention only, and DeepSpeed trains it with the experts whole on every
  rank (measured, ``bench/tp_true_peak.py``).
- AutoTP with ZeRO-3 trains only from DeepSpeed 0.19.4 on (:func:`tuner.workload.autotp_zero3_problem`): the version is
  the caller's to give (the measured-run boundary reads the installed one); this module imports no DeepSpeed.
- AutoTP together with AutoEP (DeepSpeed's "folding", ``module_inject/auto_ep_folding.py``) is refused: the
  estimator does not model it.
- AutoTP together with Ulysses sequence parallelism is refused: ``DeepSpeedEngine._configure_tensor_parallel_states``
  sets ``self.mpu = groups`` (its own tensor-parallel mesh), dropping the Ulysses mpu the engine was given.
- ``zero_optimization.zero_hpz_partition_size`` (hpZ) partitions a secondary copy of the 16-bit parameters: it
  exists at ZeRO-3 only, and its groups must divide the ranks. With AutoTP it is refused: DeepSpeed 0.19.8 builds
  the hpZ groups from consecutive ranks of the whole world (``groups._create_zero_param_parallel_group``), which
  under AutoTP are the ranks of one tensor-parallel group, holding different shards of the same parameters. Measured
  through the runner (tiny LLaMA, fp32, TP 2 × DP 2 on 2 nodes of 2, ZeRO-3): without hpZ the step-0 loss and
  gradient norm equal the one-rank run's (6.2622952, 0.8469947); with hpZ 2 they are 6.2583408 and 0.8384255.

The checks of a trial are each layout's (:meth:`tuner.workload.layouts.LayoutKind.check`), together
:func:`tuner.workload.check_layout`; this module holds the rules' pieces they share.

Example:
    >>> from tuner.workload import ClusterSpec, TrialConfig, Workload, check_layout, load_builtin_model
    >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8))
    >>> check_layout(work, TrialConfig({"tensor_parallel": {"autotp_size": 4}}))
    >>> check_layout(work, TrialConfig({"tensor_parallel": {"autotp_size": 3}}))
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: tensor_parallel.autotp_size: tp = 3 must divide the 8 GPUs of a node (...)
"""

from __future__ import annotations

from tuner.workload.model import ModelSpec
from tuner.workload.spec import Workload

TP_KEY = "tensor_parallel.autotp_size"
HPZ_KEY = "zero_optimization.zero_hpz_partition_size"
AUTOTP_ZERO3_SINCE = (0, 19, 4)
HPZ_WITH_TP = (
    "hpZ with AutoTP is refused: DeepSpeed 0.19.8 makes hpZ groups of consecutive ranks, which under AutoTP are one "
    "tensor-parallel group holding different shards (measured: step-0 gradient norm 1 % off the reference)"
)
TP_WITH_EP = (
    "AutoTP with AutoEP (DeepSpeed's folding of expert and tensor parallelism) is not estimated by dstune: "
    "use one of the two"
)
TP_WITH_SP = (
    "AutoTP with Ulysses (sequence_parallel_size > 1) is not supported: DeepSpeed 0.19.8's AutoTP replaces the "
    "engine's mpu (Ulysses' groups) with its own tensor-parallel groups"
)


def tensor_parallel_problem(workload: Workload, tp: int) -> str | None:
    """Why AutoTP cannot run at degree ``tp`` on ``workload`` (GPUs of a node, heads, key-value heads), or None.

    >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
    >>> work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=8))
    >>> [tp for tp in (1, 2, 3, 4, 8, 16) if tensor_parallel_problem(work, tp) is None]
    [1, 2, 4, 8]
    """
    if tp == 1:
        return None
    gpus, model = workload.cluster.gpus_per_node, workload.model
    heads, kv = model.num_heads, model.num_kv_heads or model.num_heads
    if gpus % tp:
        return f"tp = {tp} must divide the {gpus} GPUs of a node (AutoTP all-reduces every layer within a node)"
    if heads and heads % tp:
        return f"tp = {tp} must divide the {heads} attention heads (AutoTP shards q, k and v by heads)"
    if kv and kv % tp:
        return f"tp = {tp} must divide the {kv} key-value heads (a rank beyond them holds no attention shard)"
    if is_moe(model) and not tp_plan_split(workload):
        return (
            "AutoTP on an MoE model needs a transformers tp_plan DeepSpeed takes (without expert styles such as "
            "moe_tp_experts or packed_colwise; the experts then stay whole), and this model's profile has none"
        )
    return None


def tp_plan_split(workload: Workload) -> tuple[bool, ...]:
    """Which of the model's parameters AutoTP shards, as the workload's profile read it from the model's tp_plan
    (:mod:`tuner.profile.tp_plan`); empty without a profile of these parameters or a plan DeepSpeed takes."""
    profile = workload.profile
    return profile.tp_sharded if profile is not None and profile.param_numels == workload.model.param_numels else ()


def is_moe(model: ModelSpec) -> bool:
    """True when the model's transformers config has routed experts."""
    return model.routed_experts > 0


def hpz_problem(stage: int, hpz: int, world: int) -> str | None:
    """Why hpZ groups of ``hpz`` ranks cannot run at ZeRO ``stage`` on ``world`` ranks, or None.

    >>> hpz_problem(3, 2, 4) is None, hpz_problem(2, 2, 4), hpz_problem(3, 3, 4)
    (True, 'hpZ (2) is a ZeRO-3 feature; this is stage 2', 'hpZ groups of 3 ranks must divide the 4 ranks')
    """
    if hpz <= 1:
        return None
    if stage != 3:
        return f"hpZ ({hpz}) is a ZeRO-3 feature; this is stage {stage}"
    if world % hpz:
        return f"hpZ groups of {hpz} ranks must divide the {world} ranks"
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string (``0.19.4+cu12`` → ``(0, 19, 4)``).

    >>> version_tuple("0.19.4+abc"), version_tuple("0.18.10")
    ((0, 19, 4), (0, 18, 10))
    """
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


__all__ = [
    "AUTOTP_ZERO3_SINCE",
    "HPZ_KEY",
    "HPZ_WITH_TP",
    "TP_KEY",
    "TP_WITH_EP",
    "TP_WITH_SP",
    "hpz_problem",
    "tensor_parallel_problem",
    "tp_plan_split",
    "version_tuple",
]
