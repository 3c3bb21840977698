"""The request schemas every face builds its input through (pydantic): a workload (:class:`WorkloadRequest`,
:func:`to_workload`), a trial config (:class:`TrialRequest`, and :func:`trial_workload`, the workload carrying the
activations it trains with; :class:`WorkloadInput` is the API's and the job queue's workload object, which carries
the trial's shortcut fields too) and a tuning job (:class:`JobRequest`).
The CLI, the HTTP API and the job queue share them, so a field is checked, named and documented once.

May import: :mod:`tuner.workload`, :mod:`tuner.profile` (its plain-data side), :mod:`tuner.space` (names,
validation and the shortcut ds_config), :mod:`tuner.measure.options` (the measuring defaults), :mod:`tuner.estimator`
(``resolve``: what a trial's ds_config trains in), pydantic.
"""

from tuner.requests.job import JobRequest, check_job, job_workload, tuning_workload
from tuner.requests.names import NAME_PATTERN, check_study_name, default_study_name, is_study_name, readable_name
from tuner.requests.strict import RequestModel
from tuner.requests.trial import TrialRequest, TrialSettings, WorkloadInput
from tuner.requests.trial_workload import trial_workload
from tuner.requests.workload import (
    LAUNCHERS,
    MAX_BYTES,
    MAX_PARAMS,
    MAX_WORLD_SIZE,
    OFFLOAD_TARGETS,
    SAMPLERS,
    Attention,
    Device,
    FieldError,
    Launcher,
    LaunchRequest,
    Loc,
    ModelImpl,
    Offload,
    Precision,
    Sampler,
    WorkloadRequest,
    check_request,
    to_workload,
    validated,
)
from tuner.workload import ATTENTION_KINDS, DEVICES, LAUNCHER_ENVS, MODEL_IMPLS, PRECISIONS, LauncherEnv

__all__ = [
    "ATTENTION_KINDS",
    "DEVICES",
    "LAUNCHERS",
    "LAUNCHER_ENVS",
    "MAX_BYTES",
    "MAX_PARAMS",
    "MAX_WORLD_SIZE",
    "MODEL_IMPLS",
    "NAME_PATTERN",
    "OFFLOAD_TARGETS",
    "PRECISIONS",
    "SAMPLERS",
    "Attention",
    "Device",
    "FieldError",
    "JobRequest",
    "LaunchRequest",
    "Launcher",
    "LauncherEnv",
    "Loc",
    "ModelImpl",
    "Offload",
    "Precision",
    "RequestModel",
    "Sampler",
    "TrialRequest",
    "TrialSettings",
    "WorkloadInput",
    "WorkloadRequest",
    "check_job",
    "check_request",
    "check_study_name",
    "default_study_name",
    "is_study_name",
    "job_workload",
    "readable_name",
    "to_workload",
    "trial_workload",
    "tuning_workload",
    "validated",
]
