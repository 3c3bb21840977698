"""Tuning jobs: the request models shared by the API and the worker, and how a job becomes a study.

A job is a row of ``dstune_jobs`` (:meth:`tuner.store.Store.enqueue_job`): the study name and the validated
:class:`JobRequest` as JSON. ``dstune worker`` claims queued jobs (:meth:`Store.claim_next_job`, never the same job
twice) and runs each as a study (:mod:`tuner.worker`). Status: ``queued`` → ``running`` → ``done`` | ``failed`` |
``cancelled``; cancelling a running job sets ``cancel_requested`` and its worker stops the study between trials.

Requests describe models as specs only (a built-in preset name, an inline Hugging Face ``config.json`` object, or a
parameter count), never as paths or import strings: nothing in a request makes the server read a file or run code.
Any causal LM transformers ships is accepted (``auto_map``/``trust_remote_code`` refused); its profile (exact
parameters, traced activations) comes from the disk cache or is computed off the request path with bounded cost
(:mod:`tuner.profile.service`; a request that would wait too long gets :class:`ProfilePending`).

Example:
    >>> request = WorkloadRequest(model="tiny-gpt2", gpus=2, gpu_memory="24GiB", device="cpu")
    >>> workload = to_workload(request)
    >>> workload.cluster.world_size, workload.cluster.gpu_memory
    (2, 25769803776)
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.estimator import ConfigError, estimate
from tuner.profile import ModelProfile, model_from_config, with_profile
from tuner.profile.profiles import spec_from_profile
from tuner.profile.service import ProfilePending, default_service
from tuner.units import parse_bytes
from tuner.workload import (
    ClusterSpec,
    ModelSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    model_from_hf_config,
    model_from_param_count,
    preset_config,
    preset_names,
)

MAX_BYTES = 2**60  # memory sizes beyond an exbibyte are typos (and overflow BIGINT columns)
MAX_PARAMS = 10**15
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
Loc = tuple[str | int, ...]
MemorySize = Annotated[int, Field(ge=1, le=MAX_BYTES)] | Annotated[str, Field(min_length=1, max_length=32)]


class FieldError(ValueError):
    """Bad input at ``loc`` (a path inside the request body, FastAPI style)."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(f"{'.'.join(map(str, loc))}: {message}")
        self.loc = loc
        self.message = message


class WorkloadRequest(BaseModel):
    """A workload, with the fields of the CLI's workload flags (``--gpus`` is GPUs per node).

    Give exactly one of ``model`` (a built-in preset name), ``config`` (an inline Hugging Face ``config.json``
    object) and ``params`` (a bare parameter count: model states only).
    """

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] | None = Field(
        None, description="Built-in preset name (see dstune's presets), e.g. llama-2-7b.", examples=["tiny-gpt2"]
    )
    config: dict[str, Any] | None = Field(None, description="Inline Hugging Face config.json object.")
    params: float | None = Field(None, gt=0, le=MAX_PARAMS, description="Bare parameter count, e.g. 7.5e9.")
    gpus: int = Field(1, ge=1, le=4096, description="GPUs per node.")
    nodes: int = Field(1, ge=1, le=4096)
    gpu_memory: MemorySize = Field("80GiB", description="Per GPU: bytes or a size such as 80GiB.")
    cpu_memory: MemorySize = Field("1TiB", description="Per node: bytes or a size such as 1TiB.")
    seq_len: int = Field(2048, ge=1, le=2**20)
    micro_batch: int = Field(1, ge=1, le=2**16)
    grad_accum: int = Field(1, ge=1, le=2**16)
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    attention: Literal["sdpa", "flash", "eager"] = "sdpa"
    activation_checkpointing: bool = False
    device: Literal["cuda", "cpu"] = "cuda"
    model_impl: Literal["transformers", "builtin"] = Field(
        "transformers", description="The model measured runs train: transformers from_config, or dstune's built-in one."
    )


def _size(value: int | str, name: str, loc: Loc) -> int:
    try:
        size = parse_bytes(value)
    except ValueError as error:
        raise FieldError((*loc, name), str(error)) from None
    if size > MAX_BYTES:
        raise FieldError((*loc, name), f"must be at most {MAX_BYTES} bytes")
    return size


def _workload_loc(request: WorkloadRequest, field_name: str, loc: Loc) -> Loc:
    """Where in the request a :class:`WorkloadError`'s field lives."""
    head, _, rest = field_name.partition(".")
    if head == "model":
        if request.config is not None:
            return (*loc, "config", *([rest] if rest else []))
        return (*loc, "params" if request.params is not None else "model")
    renamed = {"gpus-per-node": "gpus"}.get(field_name, field_name.replace("-", "_"))
    return (*loc, renamed)


@functools.lru_cache(maxsize=64)
def _preset_model(name: str) -> ModelSpec:
    """A built-in preset's model (cached: presets are files shipped with the package)."""
    if name not in preset_names():
        raise WorkloadError("model", f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return model_from_hf_config(preset_config(name), name=name)


def _hf_model(request: WorkloadRequest, train: TrainSpec, inline: bool) -> tuple[ModelSpec, ModelProfile | None]:
    """The model of a preset or inline config, with its profile when measured runs train the transformers model."""
    if request.model is not None:
        if request.model not in preset_names():
            raise WorkloadError("model", f"unknown preset {request.model!r}; presets: {', '.join(preset_names())}")
        config, name = preset_config(request.model), request.model
    else:
        config = request.config or {}
        name = str(config.get("_name_or_path", "custom"))[:64]
    if request.model_impl == "builtin":
        return (_preset_model(name) if request.model is not None else model_from_hf_config(config, name=name)), None
    if inline:  # in this process, however long it takes (the worker)
        workload = with_profile(Workload(model_from_config(config, name), train=train))
        return workload.model, workload.profile
    profile = default_service().profile(config, train.seq_len, (train.precision,), train.attention)
    return spec_from_profile(config, profile, name), profile


def to_workload(request: WorkloadRequest, loc: Loc = (), *, inline: bool = False) -> Workload:
    """The :class:`Workload` a request describes; :class:`FieldError` (with the field's path) for bad input.

    ``inline``: compute a missing model profile here, however long it takes, instead of through the bounded
    profile service (which raises :class:`ProfilePending` when it needs longer).
    """
    given = [name for name in ("model", "config", "params") if getattr(request, name) is not None]
    if len(given) != 1:
        raise FieldError((*loc, "model"), "give exactly one of model (a preset name), config or params")
    try:
        cluster = ClusterSpec(
            gpus_per_node=request.gpus,
            nodes=request.nodes,
            gpu_memory=_size(request.gpu_memory, "gpu_memory", loc),
            cpu_memory=_size(request.cpu_memory, "cpu_memory", loc),
            device=request.device,
        )
        train = TrainSpec(
            seq_len=request.seq_len,
            micro_batch=request.micro_batch,
            grad_accum=request.grad_accum,
            precision=request.precision,
            activation_checkpointing=request.activation_checkpointing,
            attention=request.attention,
        )
        profile = None
        if request.params is not None:
            model = model_from_param_count(float(request.params))
        else:
            model, profile = _hf_model(request, train, inline)
    except WorkloadError as error:
        message = str(error).removeprefix(f"{error.field}: ")
        raise FieldError(_workload_loc(request, error.field, loc), message) from None
    except FieldError:
        raise
    except (TypeError, ValueError, OverflowError, ArithmeticError) as error:  # odd values in an inline config
        raise FieldError((*loc, "config"), f"not a usable model config: {error}") from None
    if not 0 < model.n_params <= MAX_PARAMS:
        raise FieldError((*loc, "config" if request.config is not None else "model"), "implausible parameter count")
    return Workload(model, cluster, train, profile=profile)


def checked_estimate(workload: Workload, ds_config: dict[str, Any], loc: Loc = ("ds_config",)) -> Any:
    """:func:`tuner.estimator.estimate`, with a :class:`ConfigError` (or arithmetic on absurd values) as a
    :class:`FieldError` at the config key's path."""
    try:
        return estimate(workload, ds_config)
    except ConfigError as error:
        message = str(error).removeprefix(f"{error.field}: ")
        raise FieldError((*loc, *error.field.split(".")), message) from None
    except (TypeError, ValueError, OverflowError, ArithmeticError, KeyError) as error:
        raise FieldError(loc, f"cannot estimate this config: {error}") from None


class JobRequest(BaseModel):
    """A tuning job: what ``dstune tune`` would be asked, as data. The worker runs it as a study."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadRequest
    study: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        None, description="Study name; an existing study of the same workload resumes. Default: model-fingerprint."
    )
    space: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = Field(
        "default", description="A built-in search space by name (never a path)."
    )
    pins: dict[str, Any] = Field(default_factory=dict, description="Pinned parameters, as `dstune tune --pin`.")
    global_batch: int | None = Field(None, ge=1, le=2**24)
    sampler: Literal["tpe", "random", "grid", "gp"] = "tpe"
    trials: int = Field(12, ge=1, le=10_000)
    timeout_s: float | None = Field(None, gt=0, le=7 * 24 * 3600, description="Stop asking after this long.")
    launcher: Literal["local", "ray"] = "ray"
    warmup: int = Field(2, ge=0, le=1000)
    steps: int = Field(3, ge=1, le=10_000)
    run_timeout: float = Field(600.0, ge=1, le=24 * 3600)
    pareto: bool = False
    seed: int | None = Field(None, ge=0, le=2**32 - 1)


def tuning_workload(request: WorkloadRequest, loc: Loc = (), *, inline: bool = False) -> Workload:
    """The workload a study searches for: micro-batch, accumulation and checkpointing are what the search decides,
    so they are reset to the defaults ``dstune tune`` stores (1, 1, off): the same model and cluster always meet the
    same stored workload (and :func:`tuner.recommend.recommend` finds its measurements)."""
    from dataclasses import replace

    workload = to_workload(request, loc, inline=inline)
    return replace(workload, train=replace(workload.train, micro_batch=1, grad_accum=1, activation_checkpointing=False))


def check_job(request: JobRequest) -> str:
    """Validate a job beyond its schema (workload, search space, pins); returns its study name."""
    from tuner.space import SpaceError, load_space, space_names
    from tuner.tune import resolve_space

    workload = tuning_workload(request.workload, ("workload",))
    if request.space not in space_names():
        raise FieldError(("space",), f"unknown search space {request.space!r}; built-in: {', '.join(space_names())}")
    try:
        load_space(resolve_space(request.space), pins=request.pins)
    except (SpaceError, TypeError, ValueError) as error:
        raise FieldError(("pins",), str(error)) from None
    return request.study or f"{workload.model.name}-{workload.fingerprint()[:8]}"


def study_settings(
    request: JobRequest, study_name: str, *, launcher: str | None = None, ray_address: str | None = None
) -> Any:
    """The :class:`tuner.study.StudySettings` of a job (the worker may override the launcher and Ray address)."""
    from tuner.dispatch import DispatchOptions
    from tuner.study import StudySettings
    from tuner.tune import resolve_space

    workload = tuning_workload(request.workload, inline=True)
    return StudySettings(
        name=study_name,
        workload=workload,
        space_path=resolve_space(request.space),
        pins=dict(request.pins),
        global_batch=request.global_batch,
        sampler=request.sampler,
        trials=request.trials,
        timeout_s=request.timeout_s,
        pareto=request.pareto,
        seed=request.seed,
        dispatch=DispatchOptions(
            launcher or request.launcher, ray_address, request.warmup, request.steps, request.run_timeout
        ),
    )


__all__ = [
    "FieldError",
    "JobRequest",
    "ProfilePending",
    "WorkloadRequest",
    "check_job",
    "checked_estimate",
    "study_settings",
    "to_workload",
    "tuning_workload",
]
