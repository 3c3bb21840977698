"""The workload a trial is estimated with: carrying the activations traced for the precision the trial's ds_config
trains in (under its ``torch_autocast``), its activation checkpointing and its Ulysses degree. One path for every
face: ``dstune estimate`` (traced in this process) and ``POST /v1/estimate`` (traced by the profiling service's
worker process: a server never imports torch), so that both answer the same bytes for the same input."""

from __future__ import annotations

import json
from dataclasses import replace

from tuner.estimator import resolve
from tuner.profile import with_profile
from tuner.profile.service import default_service
from tuner.workload import TrialConfig, Workload
from tuner.workload.autocast import trace_precision


def trial_workload(
    workload: Workload, trial: TrialConfig, lengths: tuple[int, ...] = (), *, inline: bool = True
) -> Workload:
    """``workload`` with the traced activations ``trial`` trains with (``lengths``: more sequence lengths the profile
    holds); as it is when the workload's own profile has them already. ``inline=False`` (the API): a missing
    profile is traced by the bounded profiling service, which raises
    :class:`~tuner.profile.service.ProfilePending` past its wait.

    Raises:
        tuner.estimator.ConfigError: the ds_config does not read (its key named).
        tuner.workload.WorkloadError: the model cannot be checkpointed (field ``activation-checkpointing``) or
            profiled.
    """
    settings = resolve(workload, trial)
    precision, sp = settings.precision, settings.ranks.sequence
    precision = trace_precision(precision, settings.autocast, workload.cluster.device)  # under its torch_autocast
    if sp > 1:  # traced at a rank's s/sp tokens: what the model builds before its layers can be s x s
        lengths = (*lengths, workload.train.seq_len // sp)
    if precision == workload.train.precision and not trial.activation_checkpointing and sp == 1:
        return workload
    if inline:
        return with_profile(
            workload, precisions=(precision,), activation_checkpointing=trial.activation_checkpointing, lengths=lengths
        )
    model, train = workload.model, workload.train
    if model.implementation != "transformers" or not model.hf_config:
        return workload  # built-in and bare models: their activations are formulas
    profile = default_service().profile(
        json.loads(model.hf_config), train.seq_len, (precision,), train.attention, workload.trainable, lengths
    )
    return replace(workload, profile=profile)


__all__ = ["trial_workload"]
