"""What is being trained: the model (:class:`tuner.workload.ModelSpec`), the cluster (:class:`ClusterSpec`), the
sequence length, precision, attention and optimizer (:class:`TrainSpec`), and which parameters train
(:class:`TrainableSpec`), together a :class:`Workload` with its stable fingerprint and stored dict. How it is trained
(micro-batch, accumulation, ZeRO, activation checkpointing: what the search decides) is a
:class:`tuner.workload.TrialConfig`, not part of a workload.

Pure Python: no torch, no transformers. A :class:`Workload` may carry the model's profile (traced activations) for the
estimator; the profile never enters fingerprints or stored dicts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.workload.model_profile import ModelProfile

from tuner.errors import InputError
from tuner.workload.errors import WorkloadError
from tuner.workload.gpu_types import GPU_TYPE_NAMES, bf16_problem
from tuner.workload.launch_env import LaunchEnv
from tuner.workload.model import ModelSpec
from tuner.workload.patterns import compile_pattern
from tuner.workload.quantization import NEEDS_CUDA, QuantSpec
from tuner.workload.vocabulary import ATTENTION_KINDS, DEVICES, OPTIMIZERS, PRECISIONS, Device


@dataclass(frozen=True)
class ClusterSpec:
    """Where it runs: ``nodes`` × ``gpus_per_node`` data-parallel ranks, memory per GPU and per node's CPU, and the
    GPU type (:data:`tuner.workload.GPU_TYPES`; "": not given, the estimator guesses the kind from the memory)."""

    gpus_per_node: int = 1
    nodes: int = 1
    gpu_memory: int = 80 * 2**30
    cpu_memory: int = 1024 * 2**30
    device: Device = "cuda"
    gpu_type: str = ""

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "nodes", "gpu_memory", "cpu_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise WorkloadError(name.replace("_", "-"), f"must be a positive integer, got {value!r}")
        if self.device not in DEVICES:
            raise WorkloadError("device", f"must be cuda or cpu, got {self.device!r}")
        if self.gpu_type and self.gpu_type not in GPU_TYPE_NAMES:
            raise WorkloadError("gpu-type", f"must be one of {', '.join(GPU_TYPE_NAMES)}, got {self.gpu_type!r}")
        if self.gpu_type and self.device != "cuda":
            raise WorkloadError("gpu-type", "a GPU type needs device cuda")

    @property
    def hardware_key(self) -> str:
        """The kind of hardware that calibrations and fitted throughput constants are kept for (``cpu``, or
        ``cuda:`` and the per-GPU memory).

        >>> ClusterSpec(gpus_per_node=2, device="cpu").hardware_key, ClusterSpec(gpu_memory=80 * 2**30).hardware_key
        ('cpu', 'cuda:85899345920')
        """
        return "cpu" if self.device == "cpu" else f"cuda:{self.gpu_memory}"

    @property
    def world_size(self) -> int:
        """Data-parallel world size, as DeepSpeed's launcher counts it."""
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class TrainSpec:
    """What is trained on: the sequence length, precision, optimizer and attention. How it is trained (micro-batch,
    accumulation, ZeRO, checkpointing: what the search decides) is a :class:`tuner.workload.TrialConfig`."""

    seq_len: int = 2048
    precision: str = "bf16"
    optimizer: str = "adamw"
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len <= 0:
            raise WorkloadError("seq-len", f"must be a positive integer, got {self.seq_len!r}")
        if self.precision not in PRECISIONS:
            raise WorkloadError("precision", f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise WorkloadError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.attention not in ATTENTION_KINDS:
            raise WorkloadError("attention", f"must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}")


# TrainSpec's fields before the search's settings moved to tuner.workload.TrialConfig, at the values studies stored
# (the search decides them): still in fingerprints, so those of stored workloads do not change; dropped when an old
# stored dict is read (workload_from_dict).
LEGACY_TRAIN: dict[str, Any] = {"micro_batch": 1, "grad_accum": 1, "activation_checkpointing": False}

MAX_FREEZE_PATTERN = 1024  # characters of a --freeze regular expression
MAX_SEQ_LEN = 2**26  # tokens: the longest length the estimator answers (67M, beyond any published run)


@dataclass(frozen=True)
class TrainableSpec:
    """Which of the model's parameters train: all of them (the default), or what a peft adapter and a freeze
    pattern leave trainable.

    ``peft``: a ``peft`` adapter config (the ``adapter_config.json`` object) as canonical JSON; its adapters are
    added to the model, and only they (with its ``modules_to_save`` copies) train. ``freeze``: a regular expression
    searched in parameter names as transformers names them (``model.embed_tokens.weight``); the parameters it
    matches are frozen (plain partial fine-tuning; with ``peft``, applied to the peft model's names too).
    The adapter's own fields are checked where the real ``peft`` library builds it (:mod:`tuner.profile`).
    ``quantization``: a 4-bit bitsandbytes base (QLoRA, :class:`tuner.workload.QuantSpec`) as canonical JSON;
    it needs an adapter (4-bit weights do not train) and CUDA (a :class:`Workload` on CPU refuses it).

    >>> TrainableSpec(freeze="embed").is_full, TrainableSpec().is_full
    (False, True)
    >>> TrainableSpec(freeze="(")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.errors.WorkloadError: freeze: not a regular expression RE2 can run (linear time): missing ): (
    """

    peft: str = ""
    freeze: str = ""
    quantization: str = ""

    def __post_init__(self) -> None:
        if self.quantization:
            try:
                QuantSpec.parse(self.quantization)  # checked field by field
            except InputError as error:
                raise WorkloadError(error.field, error.message) from None
            except json.JSONDecodeError as error:
                raise WorkloadError("quantization", f"not JSON: {error}") from None
            if not self.peft:
                raise WorkloadError(
                    "quantization", "a 4-bit base needs a peft adapter (--peft): its weights do not train"
                )
        if len(self.freeze) > MAX_FREEZE_PATTERN:
            raise WorkloadError("freeze", f"at most {MAX_FREEZE_PATTERN} characters")
        try:
            compile_pattern(self.freeze, "freeze")  # RE2: linear time, whatever the pattern
        except InputError as error:
            raise WorkloadError(error.field, error.message) from None
        if self.peft:
            try:
                adapter = json.loads(self.peft)
            except json.JSONDecodeError as error:
                raise WorkloadError("peft", f"not JSON: {error}") from None
            if not isinstance(adapter, dict):
                raise WorkloadError("peft", "must be a JSON object (peft's adapter_config.json)")

    @classmethod
    def of(
        cls, peft: dict[str, Any] | None = None, freeze: str | None = None, quantization: QuantSpec | None = None
    ) -> TrainableSpec:
        """From an adapter config object (canonicalised: key order and spacing do not change fingerprints)."""
        if peft is not None and not isinstance(peft, dict):
            raise WorkloadError("peft", "must be a JSON object (peft's adapter_config.json)")
        text = json.dumps(peft, sort_keys=True, separators=(",", ":")) if peft is not None else ""
        quant = quantization.canonical() if quantization is not None else ""
        return cls(peft=text, freeze=freeze or "", quantization=quant)

    @property
    def is_full(self) -> bool:
        """True when every parameter trains (no adapter, nothing frozen)."""
        return not self.peft and not self.freeze

    @property
    def peft_config(self) -> dict[str, Any] | None:
        """The adapter config object, or None without one."""
        return json.loads(self.peft) if self.peft else None

    @property
    def quant(self) -> QuantSpec | None:
        """The 4-bit base's spec, or None for a 16/32-bit base."""
        return QuantSpec.parse(self.quantization)

    def to_dict(self) -> dict[str, str]:
        """Plain fields (``quantization`` only when set: fingerprints of workloads stored before it stay)."""
        data = asdict(self)
        if not self.quantization:
            del data["quantization"]
        return data


@dataclass(frozen=True)
class Workload:
    """Model + cluster + training settings (+ which parameters train, + the launch environment the ranks run in:
    :class:`tuner.workload.LaunchEnv`): the unit the tuner searches configs for."""

    model: ModelSpec
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    profile: ModelProfile | None = field(default=None, compare=False, repr=False)
    trainable: TrainableSpec = field(default_factory=TrainableSpec)
    launch: LaunchEnv = field(default_factory=LaunchEnv)

    def __post_init__(self) -> None:
        if self.trainable.quantization and self.cluster.device != "cuda":
            raise WorkloadError("quantization", NEEDS_CUDA)
        problem = bf16_problem(self.cluster.gpu_type, self.train.precision)
        if problem:
            raise WorkloadError("precision", problem)

    def fingerprint(self) -> str:
        """A stable hash of everything that decides memory and speed (the model's name is left out).

        The training settings that moved to :class:`tuner.workload.TrialConfig` are hashed at the values every study
        stored its workload with (:data:`LEGACY_TRAIN`), so stored workloads keep their fingerprints.
        """
        payload = workload_to_dict(self)
        del payload["model"]["name"]
        payload["model"].pop("position_table", None)  # a limit on the sequence, not what it costs
        payload["train"].update(LEGACY_TRAIN)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """Plain JSON-ready fields of a workload (the inverse of :func:`workload_from_dict`); ``trainable`` only when
    some parameters are frozen, and ``launch`` only when it is not the deepspeed launcher's rules unchanged, so
    workloads keep the fingerprints they were stored under (the cluster's ``gpu_type`` only when given, likewise)."""
    data = {"model": workload.model.to_dict(), "cluster": asdict(workload.cluster), "train": asdict(workload.train)}
    if not workload.cluster.gpu_type:
        del data["cluster"]["gpu_type"]
    if not workload.trainable.is_full:
        data["trainable"] = workload.trainable.to_dict()
    if not workload.launch.is_default:
        data["launch"] = workload.launch.to_dict()
    return data


def workload_from_dict(data: dict[str, Any]) -> Workload:
    """Rebuild a workload from :func:`workload_to_dict`'s output (or an older one's, whose ``train`` still holds
    the :data:`LEGACY_TRAIN` fields: they are dropped)."""
    train = {key: value for key, value in data["train"].items() if key not in LEGACY_TRAIN}
    return Workload(
        ModelSpec(**data["model"]),
        ClusterSpec(**data["cluster"]),
        TrainSpec(**train),
        trainable=TrainableSpec(**data.get("trainable", {})),
        launch=LaunchEnv.from_dict(data.get("launch") or {}),
    )
