"""The one input schema every face builds workloads through: the vocabularies, :class:`WorkloadRequest` and
:func:`to_workload`.

The CLI (``dstune estimate|measure|tune``), the HTTP API and the job queue all describe a workload with a
:class:`WorkloadRequest` and turn it into a :class:`tuner.workload.Workload` with :func:`to_workload`; bad input is a
:class:`FieldError` carrying the field's path, which each face reports its own way (the CLI: ``flag: message``,
exit 2; the API: 422 with the body path).

The vocabularies are ``Literal`` types: Typer turns them into choices, pydantic into the OpenAPI schema's inline
``enum`` lists. The workload's (precision, attention kind, device, model implementation) are declared once in
:mod:`tuner.workload.vocabulary` and re-exported here for the faces; the offload target, launcher and sampler are
declared here.

Pure: pydantic, :mod:`tuner.workload` and :mod:`tuner.profile`'s plain-data side (no torch at import, no SQL).
Imported by the faces and :mod:`tuner.requests.job`.

A Hugging Face model is, by default (``model_impl="transformers"``), the transformers model itself: its exact
parameters and traced activations come from :mod:`tuner.profile` (the disk cache, or a trace: in this process with
``inline=True``, the CLI's and the worker's way; through the bounded profiling service otherwise, the API's way,
which raises :class:`tuner.profile.service.ProfilePending` when a new profile takes longer than a request may wait).
``model_impl="builtin"`` is dstune's own model of the five built-in families, with formula activations.

Requests describe models as specs only (a built-in preset name, an inline Hugging Face ``config.json`` object, or a
parameter count), never as paths: nothing in a request makes the server read a file. The CLI reads ``--model``'s
file itself and passes its content as ``config``.

Example:
    >>> request = WorkloadRequest(model="tiny-gpt2", gpus=2, gpu_memory="24GiB", device="cpu", model_impl="builtin")
    >>> workload = to_workload(request)
    >>> workload.cluster.world_size, workload.cluster.gpu_memory
    (2, 25769803776)
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import InputError
from tuner.profile import ModelProfile, params_profile, with_profile
from tuner.profile.describe import spec_from_profile
from tuner.profile.service import default_service
from tuner.requests.plausible import MAX_PARAMS, check_counted_params
from tuner.requests.strict import RequestModel
from tuner.units import parse_bytes
from tuner.workload import (
    MAX_FREEZE_PATTERN,
    MAX_SEQ_LEN,
    NEEDS_CUDA,
    Attention,
    ClusterSpec,
    Device,
    GpuTypeName,
    LaunchEnv,
    LauncherEnv,
    ModelImpl,
    ModelSpec,
    Precision,
    QuantSpec,
    TrainableSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    bf16_problem,
    check_config_limits,
    default_gpu_memory,
    model_from_hf_config,
    model_from_param_count,
    preset_config,
    preset_names,
)
from tuner.workload.zero import OFFLOAD_DEVICES, OffloadDevice

Offload = OffloadDevice
Launcher = Literal["local", "ray"]
Sampler = Literal["tpe", "random", "grid", "gp"]
DEFAULT_ATTENTION = (
    "sdpa"  # of built-in models and bare parameter counts; transformers models: as transformers resolves
)
OFFLOAD_TARGETS = OFFLOAD_DEVICES
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
SAMPLERS: tuple[str, ...] = get_args(Sampler)

MAX_BYTES = 2**60  # memory sizes beyond an exbibyte are typos (and overflow BIGINT columns)
# Data-parallel ranks (gpus × nodes): several times the largest training jobs run (~100,000 GPUs). The estimator's
# ZeRO-1/2 partitioning visits every rank (about 0.1 s at this bound), so the bound is its cost's bound too.
MAX_WORLD_SIZE = 2**17
Loc = tuple[str | int, ...]
LAUNCH_FIELDS = {"launcher-env": "launcher", "launch-var": "variables", "launch": "variables"}  # WorkloadError's
MemorySize = Annotated[int, Field(ge=1, le=MAX_BYTES)] | Annotated[str, Field(min_length=1, max_length=32)]
Request = TypeVar("Request", bound=BaseModel)


class FieldError(InputError):
    """Bad input at ``loc`` (a path inside the request, FastAPI style); ``field`` is the dotted path."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(".".join(map(str, loc)), message)
        self.loc = loc


class LaunchRequest(RequestModel):
    """The launch environment the ranks run in (:class:`tuner.workload.LaunchEnv`): a launcher's rules for threads
    per rank, DeepSpeed's core binding, and per-variable overrides."""

    launcher: LauncherEnv = Field("deepspeed", description="Whose rules give each rank its threads.")
    bind_cores: bool = Field(
        False, description="Bind each rank to its share of the node's cores (--bind_cores_to_rank)."
    )
    variables: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Variables set for every rank, over the launcher's (OMP_NUM_THREADS, NCCL_*, ...).",
        examples=[{"OMP_NUM_THREADS": "4", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}],
    )

    def to_launch(self) -> LaunchEnv:
        """The workload room's value (checked there: names, thread counts)."""
        return LaunchEnv.of(self.launcher, self.bind_cores, self.variables)


class WorkloadRequest(RequestModel):
    """A workload, with the fields of the CLI's workload flags (``--gpus`` is GPUs per node).

    Give exactly one of ``model`` (a built-in preset name), ``config`` (an inline Hugging Face ``config.json``
    object) and ``params`` (a bare parameter count: model states only). How it is trained (micro-batch,
    accumulation, checkpointing, ZeRO...) is a :class:`tuner.requests.TrialRequest`, not part of the workload.
    """

    # the rule a 4-bit base follows, in the schema too: an object under quantization needs an object under peft
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"quantization": {"type": "object"}}, "required": ["quantization"]},
            "then": {"properties": {"peft": {"type": "object"}}, "required": ["peft"]},
        }
    )

    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] | None = Field(
        None, description="Built-in preset name (see dstune's presets), e.g. llama-2-7b.", examples=["tiny-gpt2"]
    )
    config: dict[str, Any] | None = Field(None, description="Inline Hugging Face config.json object.")
    params: float | None = Field(
        None, gt=0, le=MAX_PARAMS, allow_inf_nan=False, description="Bare parameter count, e.g. 7.5e9."
    )
    gpus: int = Field(1, ge=1, le=4096, description="GPUs per node.")
    nodes: int = Field(1, ge=1, le=4096)
    gpu_memory: MemorySize | None = Field(None, description="Per GPU: bytes or 80GiB; default: gpu_type's, else 80GiB.")
    gpu_type: GpuTypeName | None = Field(None, description="The GPU: usable memory, CUDA terms, throughput table.")
    cpu_memory: MemorySize = Field("1TiB", description="Per node: bytes or a size such as 1TiB.")
    seq_len: int = Field(2048, ge=1, le=MAX_SEQ_LEN)
    precision: Precision = "bf16"
    attention: Attention | None = Field(
        None,
        description="Attention kernel; default: the one transformers builds the model with (sdpa, else eager); "
        "sdpa for built-in models.",
    )
    device: Device = "cuda"
    model_impl: ModelImpl = Field(
        "transformers", description="The model measured runs train: transformers from_config, or dstune's built-in one."
    )
    peft: dict[str, Any] | None = Field(
        None,
        description="A peft adapter config (adapter_config.json object, LoRA): only its adapters (and "
        "modules_to_save) train.",
    )
    freeze: str | None = Field(
        None,
        max_length=MAX_FREEZE_PATTERN,
        description="Regular expression over parameter names (model.embed_tokens.weight): matching parameters are "
        "frozen.",
        examples=["embed_tokens"],
    )
    quantization: dict[str, Any] | None = Field(
        None,
        description="A 4-bit bitsandbytes base (QLoRA): a BitsAndBytesConfig object as transformers writes it in "
        "config.json's quantization_config (which it overrides); needs peft and device cuda; estimate only.",
        examples=[{"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_quant_storage": "bfloat16"}],
    )
    launch: LaunchRequest | None = Field(
        None, description="The launch environment measured runs use; default: the deepspeed launcher's rules."
    )


def validated(model: type[Request], data: dict[str, Any], loc: Loc = ()) -> Request:
    """``model`` validated from ``data``; the first bad field as a :class:`FieldError` instead of pydantic's
    :class:`ValidationError` (for faces that report one line, not FastAPI's list).

    Example:
        >>> validated(WorkloadRequest, {"model": "tiny-gpt2", "gpus": 0})
        Traceback (most recent call last):
        tuner.requests.workload.FieldError: gpus: Input should be greater than or equal to 1
    """
    try:
        return model.model_validate(data)
    except ValidationError as error:
        errors = error.errors(include_url=False)
        head = errors[0]["loc"][:1]
        # a union (e.g. a memory size: bytes or text) reports each branch; the last one is the branch given
        last = [item for item in errors if item["loc"][:1] == head][-1]
        raise FieldError((*loc, *head), last["msg"]) from None


def _size(value: int | str, name: str, loc: Loc) -> int:
    try:
        size = parse_bytes(value)
    except ValueError as error:
        raise FieldError((*loc, name), str(error)) from None
    if size > MAX_BYTES:
        raise FieldError((*loc, name), f"must be at most {MAX_BYTES // 2**40:,} TiB (2^60 bytes)")
    return size


def _cluster(request: WorkloadRequest, loc: Loc) -> ClusterSpec:
    """The request's cluster; memory per GPU: ``gpu_memory``, else the ``gpu_type``'s usable memory, else 80 GiB."""
    return ClusterSpec(
        gpus_per_node=request.gpus,
        nodes=request.nodes,
        gpu_memory=_size(request.gpu_memory or default_gpu_memory(request.gpu_type), "gpu_memory", loc),
        cpu_memory=_size(request.cpu_memory, "cpu_memory", loc),
        device=request.device,
        gpu_type=request.gpu_type or "",
    )


def _workload_loc(request: WorkloadRequest, field_name: str, loc: Loc) -> Loc:
    """Where in the request a :class:`WorkloadError`'s field lives."""
    head, _, rest = field_name.partition(".")
    if head == "model":
        if request.config is not None:
            return (*loc, "config", *(rest.split(".") if rest else []))
        return (*loc, "params" if request.params is not None else "model")
    if head in ("peft", "quantization"):  # an adapter or quantization config's field: peft.r
        return (*loc, head, *(rest.split(".") if rest else []))
    if field_name in LAUNCH_FIELDS:
        return (*loc, "launch", LAUNCH_FIELDS[field_name])
    renamed = {"gpus-per-node": "gpus"}.get(field_name, field_name.replace("-", "_"))
    return (*loc, renamed)


@functools.lru_cache(maxsize=64)
def _preset_model(name: str) -> ModelSpec:
    """A built-in preset's model (cached: presets are files shipped with the package)."""
    if name not in preset_names():
        raise WorkloadError("model", f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return model_from_hf_config(preset_config(name), name=name)


def _hf_model(
    request: WorkloadRequest, train: TrainSpec, inline: bool, config_name: str | None, lengths: tuple[int, ...] = ()
) -> tuple[ModelSpec, ModelProfile | None, TrainSpec]:
    """The model of a preset or an inline config, with its profile when it is the transformers model, and ``train``
    with the attention the model trains with (no ``attention`` asked: the one transformers resolves for it)."""
    if request.model is not None:
        if request.model_impl == "builtin":
            return _preset_model(request.model), None, train
        if request.model not in preset_names():
            raise WorkloadError("model", f"unknown preset {request.model!r}; presets: {', '.join(preset_names())}")
        config, name = preset_config(request.model), request.model
    else:
        config = request.config or {}
        name = config_name or str(config.get("_name_or_path", "custom"))[:64]
        if request.model_impl == "builtin":
            return model_from_hf_config(config, name=name), None, train
    if inline:  # in this process, however long a new profile takes (the CLI, the worker)
        described = params_profile(config)  # read (or traced) once: the model's parameters and its attention
        model = spec_from_profile(config, described, name)
        if request.attention is None:
            train = replace(train, attention=described.attention)
        workload = with_profile(Workload(model, train=train), lengths=lengths)
        return workload.model, workload.profile, train
    profile = default_service().profile(config, train.seq_len, (train.precision,), request.attention, lengths=lengths)
    return (
        spec_from_profile(config, profile, name),
        profile,
        replace(train, attention=request.attention or profile.attention),
    )


def _trained_off_process(workload: Workload, lengths: tuple[int, ...] = ()) -> Workload:
    """The workload with the profile of its model as trained, computed by the profiling service's worker process
    (a server never imports torch, transformers or peft); models without a transformers config are left to
    :func:`with_profile`, which refuses them without importing anything."""
    model, train = workload.model, workload.train
    if model.implementation != "transformers" or not model.hf_config:
        return with_profile(workload)
    config = json.loads(model.hf_config)
    service = default_service()
    trainable = workload.trainable
    profile = service.profile(config, train.seq_len, (train.precision,), train.attention, trainable, lengths)
    return replace(workload, profile=profile)


def _quantization_field(request: WorkloadRequest) -> str:
    """Where the request's 4-bit base is given: ``quantization``, or the model config's ``quantization_config``."""
    return "quantization" if request.quantization is not None else "model.quantization_config"


def _quantization(request: WorkloadRequest) -> QuantSpec | None:
    """The 4-bit base of a request: its ``quantization``, else its model config's ``quantization_config``."""
    config = request.quantization
    if config is None and request.params is None:
        model_config = request.config if request.config is not None else preset_config(request.model or "")
        config = model_config.get("quantization_config")
    if config is None:
        return None
    field = _quantization_field(request)
    try:
        return QuantSpec.of(config, field)
    except WorkloadError:
        raise
    except InputError as error:
        raise WorkloadError(error.field, error.message) from None


def check_request(request: WorkloadRequest, loc: Loc = ()) -> None:
    """The checks that bound a request's cost, before any work: one model source, ``gpus × nodes`` at most
    :data:`MAX_WORLD_SIZE`, an inline config's dimensions within :data:`tuner.workload.CONFIG_LIMITS` and, for the
    families dstune counts by arithmetic, a plausible parameter count. Pure and cheap (linear in the config's size,
    no model built, no file read): the API runs it on its event loop before handing work to a thread, and
    :func:`to_workload` runs it first. :class:`FieldError` naming the field.

    Example:
        >>> check_request(WorkloadRequest(model="gpt2", gpus=4096, nodes=4096), ("workload",))
        Traceback (most recent call last):
        tuner.requests.workload.FieldError: workload.nodes: gpus × nodes must be at most 131072 ranks
    """
    given = [name for name in ("model", "config", "params") if getattr(request, name) is not None]
    if len(given) != 1:
        raise FieldError((*loc, "model"), "give exactly one of model (a preset name), config or params")
    if request.gpus * request.nodes > MAX_WORLD_SIZE:
        raise FieldError((*loc, "nodes"), f"gpus × nodes must be at most {MAX_WORLD_SIZE} ranks")
    if request.config is None:
        return
    try:
        check_config_limits(request.config)
        check_counted_params(request.config)
    except WorkloadError as error:
        raise FieldError(_workload_loc(request, error.field, loc), error.message) from None


def to_workload(
    request: WorkloadRequest,
    loc: Loc = (),
    *,
    config_name: str | None = None,
    inline: bool = True,
    lengths: tuple[int, ...] = (),
) -> Workload:
    """The :class:`Workload` a request describes; :class:`FieldError` (with the field's path) for bad input.

    ``config_name`` names the model of an inline ``config`` (the CLI passes the name of ``--model``'s folder);
    by default its ``_name_or_path``, else ``custom``. ``inline=False`` (the API): a missing profile is computed by
    the bounded profiling service, which raises :class:`~tuner.profile.service.ProfilePending` past its wait.
    ``lengths``: more sequence lengths the profile holds, traced together with the request's, in this process or in
    one job of the profiling service (a search over the length extrapolates from them: ``dstune estimate
    --max-seq-len``, ``seq_len: "max"`` on the API).
    """
    check_request(request, loc)
    try:
        cluster = _cluster(request, loc)
        train = TrainSpec(
            seq_len=request.seq_len, precision=request.precision, attention=request.attention or DEFAULT_ATTENTION
        )
        trainable = TrainableSpec.of(request.peft, request.freeze, _quantization(request))
        launch = request.launch.to_launch() if request.launch is not None else LaunchEnv()
        if trainable.quantization and cluster.device != "cuda":
            raise WorkloadError(_quantization_field(request), NEEDS_CUDA)
        if problem := bf16_problem(cluster.gpu_type, train.precision):
            raise WorkloadError("precision", problem)
        if not trainable.is_full and request.model_impl == "builtin":
            raise WorkloadError(
                "peft" if request.peft is not None else "freeze",
                "needs the transformers model (model_impl transformers), not the built-in one",
            )
        profile = None
        if request.params is not None:
            model = model_from_param_count(float(request.params))
        else:
            model, profile, train = _hf_model(request, train, inline, config_name, lengths)
    except WorkloadError as error:
        raise FieldError(_workload_loc(request, error.field, loc), error.message) from None
    except FieldError:
        raise
    except (TypeError, ValueError, OverflowError, ArithmeticError) as error:  # odd values in an inline config
        raise FieldError((*loc, "config"), f"not a usable model config: {error}") from None
    if not 0 < model.n_params <= MAX_PARAMS:
        raise FieldError((*loc, "config" if request.config is not None else "model"), "implausible parameter count")
    workload = Workload(model, cluster, train, profile=profile, trainable=trainable, launch=launch)
    if trainable.is_full:
        return workload
    try:  # the model as trained: peft builds it on meta, in this process (inline) or the profiling service's
        return with_profile(workload, lengths=lengths) if inline else _trained_off_process(workload, lengths)
    except WorkloadError as error:
        raise FieldError(_workload_loc(request, error.field, loc), error.message) from None
