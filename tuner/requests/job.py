"""Tuning jobs: the request model shared by the API and the worker, and how a job becomes a study.

A job is a row of ``dstune_jobs`` (:meth:`tuner.storage.Store.enqueue_job`): the study name and the validated
:class:`JobRequest` as JSON. ``dstune worker`` claims queued jobs (:meth:`Store.claim_next_job`, never the same job
twice) and runs each as a study (:mod:`tuner.worker`). Status: ``queued`` → ``running`` → ``done`` | ``failed`` |
``cancelled``; cancelling a running job sets ``cancel_requested`` and its worker stops the study between trials.

A job's workload is a :class:`tuner.requests.WorkloadRequest`, the schema the CLI and the API build workloads through:
model specs only (a preset name, an inline ``config.json`` object, or a parameter count), never paths or import
strings: nothing in a request makes the server read a file or run code. A job may carry the user's training command
(``script``, :mod:`tuner.requests.script_job`) only when ``dstune queue`` queued it: the API refuses one (403).

Example:
    >>> request = JobRequest(workload={"model": "tiny-gpt2", "device": "cpu", "seq_len": 256}, trials=4)
    >>> check_job(request).startswith("tiny-gpt2-"), request.sampler
    (True, 'tpe')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, create_model

from tuner.measure.options import MEASURE_DEFAULTS
from tuner.requests.names import NAME_PATTERN, default_study_name
from tuner.requests.script_job import ScriptJob
from tuner.requests.strict import RequestModel
from tuner.requests.trial import WorkloadInput
from tuner.requests.workload import FieldError, Launcher, Loc, Sampler, WorkloadRequest, to_workload
from tuner.workload import Workload
from tuner.workload.layouts import ULYSSES
from tuner.workload.measurable import measurement_refusal


class _JobStudy(RequestModel):
    """The first fields of :class:`JobRequest`: the workload, the study and its space's pins."""

    workload: WorkloadInput
    study: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        None, description="Study name; an existing study of the same workload resumes. Default: model-fingerprint."
    )
    space: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = Field(
        "default", description="A built-in search space by name (never a path)."
    )
    pins: dict[str, Any] = Field(default_factory=dict, description="Pinned parameters, as `dstune tune --pin`.")


ULYSSES_PIN = Field(
    None,
    ge=1,
    le=ULYSSES.maximum,
    description=f"Pin the {ULYSSES.noun} (`dstune tune {ULYSSES.flag}`); null: searched.",
)

if TYPE_CHECKING:  # the Ulysses pin is read through the registry's kind (getattr(request, ULYSSES.field))
    _JobUlysses = _JobStudy
else:  # the Ulysses pin, named by the registry (tuner.workload.layouts), first of the long-context pins
    _JobUlysses = create_model(
        "_JobUlysses",
        __base__=_JobStudy,
        __module__=__name__,
        __doc__=None,
        **{ULYSSES.field: (int | None, ULYSSES_PIN)},
    )


class JobRequest(_JobUlysses):
    """A tuning job: what ``dstune tune`` would be asked, as data. The worker runs it as a study."""

    tiled_mlp_shards: int | None = Field(None, ge=1, le=2**20, description="Pin ALST's tiled MLP shards.")
    tiled_loss_shards: int | None = Field(None, ge=1, le=2**20, description="Pin ALST's tiled loss shards.")
    offload_checkpoints: bool | None = Field(None, description="Pin ALST's checkpoint offload.")

    def all_pins(self) -> dict[str, Any]:
        """``pins`` with the long-context fields given (the space's parameters of those names; ``pins`` wins)."""
        fields = (ULYSSES.field, "tiled_mlp_shards", "tiled_loss_shards", "offload_checkpoints")
        given = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        return {**given, **self.pins}

    global_batch: int | None = Field(None, ge=1, le=2**24)
    sampler: Sampler = "tpe"
    trials: int = Field(12, ge=1, le=10_000)
    timeout_s: float | None = Field(None, gt=0, le=7 * 24 * 3600, description="Stop asking after this long.")
    launcher: Launcher = "ray"
    warmup: int = Field(MEASURE_DEFAULTS.warmup, ge=0, le=1000)
    steps: int = Field(MEASURE_DEFAULTS.steps, ge=1, le=10_000)
    run_timeout: float = Field(MEASURE_DEFAULTS.timeout, ge=1, le=24 * 3600)
    pareto: bool = False
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    allow_numerics_changes: bool = Field(
        False, description="Also search bf16 master weights and optimizer states, Muon and the chunked loss."
    )
    script: ScriptJob | None = Field(
        None,
        description="The user's training command, measured instead of dstune's trainer: only from `dstune queue "
        "JOB.json -- <command>`, run by a worker that trusts its folder (`--allow-scripts`); the API refuses it (403).",
    )


def tuning_workload(request: WorkloadRequest, loc: Loc = (), *, inline: bool = True, script: bool = False) -> Workload:
    """The workload a study searches for. The request's micro-batch, accumulation and checkpointing are what the
    search decides (a :class:`tuner.workload.TrialConfig`), not part of the workload: the same model and cluster always
    meet the same stored workload (and :func:`tuner.recommend.recommend` finds its measurements). ``inline``: as
    :func:`tuner.requests.to_workload` (the API passes False: a new model's profile is computed off the request path).
    A workload no run can train is refused before any (:func:`tuner.workload.measurable.measurement_refusal`; not for
    a training command's study, ``script``: the command trains its own model)."""
    workload = to_workload(request, loc, inline=inline)
    refusal = None if script else measurement_refusal(workload)
    if refusal:
        field, reason = refusal
        raise FieldError((*loc, field.replace("-", "_")), reason)
    return workload


def job_workload(request: JobRequest, loc: Loc = (), *, inline: bool = True) -> Workload:
    """The workload a job's study tunes: a training command's without a model as ``dstune tune -- <command>``
    without ``--model`` (:mod:`tuner.requests.command_workload`), else :func:`tuning_workload`."""
    from tuner.requests.command_workload import command_workload, without_model

    if request.script is not None and without_model(request.workload):
        return command_workload(request.workload, request.script.command(), loc)
    return tuning_workload(request.workload, loc, inline=inline, script=request.script is not None)


def check_job(request: JobRequest, *, inline: bool = True) -> str:
    """Validate a job beyond its schema (workload, search space, pins); returns its study name."""
    from tuner.estimator import ConfigError
    from tuner.space import SpaceError, check_global_batch, resolve_space, space_names
    from tuner.space.numerics_choices import load_study_space

    workload = job_workload(request, ("workload",), inline=inline)
    if request.global_batch is not None:  # else the worker's study fails it after the job is queued
        try:
            check_global_batch(request.global_batch, workload.cluster.world_size)
        except ConfigError as error:
            raise FieldError(("global_batch",), error.message) from None
    if request.space not in space_names():
        raise FieldError(("space",), f"unknown search space {request.space!r}; built-in: {', '.join(space_names())}")
    try:
        path = resolve_space(request.space)
        load_study_space(path, request.all_pins(), workload, request.allow_numerics_changes)
    except (SpaceError, TypeError, ValueError) as error:
        raise FieldError(("pins",), str(error)) from None
    return request.study or default_study_name(workload)


__all__ = ["JobRequest", "check_job", "job_workload", "tuning_workload"]
