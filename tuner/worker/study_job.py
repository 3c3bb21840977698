"""A job run as a study: the job's request turned into :class:`tuner.study.StudySettings`, and the default executor
that runs it as a :class:`tuner.study.TuningStudy`. Its progress (trials so far, best tokens/s, the last event) is
written to the job row after every trial event, where ``GET /v1/jobs/{id}`` shows it. Cancelling a running job
(``DELETE /v1/jobs/{id}``) stops the study within about a second (``TuningStudy.run``'s ``should_stop``): no new
trial is asked, the runs in flight are killed (their ranks, locally or on Ray) and recorded failed, what finished
stays recorded, and the job ends ``cancelled``.

A job carrying a training command (``script``, queued by ``dstune queue JOB.json -- <command>``) is measured with that
command only when the worker trusts it (``dstune worker --allow-scripts DIR``:
:func:`tuner.measure.script.trust.check_trusted`); otherwise it fails with the reason, before anything runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.measure.options import MeasureOptions
from tuner.requests import JobRequest, job_workload
from tuner.storage import JobRecord, Store
from tuner.study import SCRIPT_PATIENCE, Event, StudySettings, TuningStudy
from tuner.worker.lease import JobHandle

_log = logging.getLogger(__name__)


def study_settings(
    request: JobRequest,
    study_name: str,
    *,
    launcher: str | None = None,
    ray_address: str | None = None,
    trusted: Sequence[str | Path] = (),
) -> StudySettings:
    """The :class:`tuner.study.StudySettings` of a job (the worker may override the launcher and Ray address); a
    training command outside the folders the worker trusts (``trusted``) raises
    :class:`tuner.measure.script.trust.UntrustedCommand`."""
    from tuner.measure.script.trust import check_trusted
    from tuner.space import resolve_space

    script = request.script.command() if request.script is not None else None
    if script is not None:
        check_trusted(script, trusted)
    from tuner.requests.command_workload import seq_len_known

    workload = job_workload(request)  # a command's without a model: as `dstune tune -- <command>` has it
    return StudySettings(
        name=study_name,
        workload=workload,
        space_path=resolve_space(request.space),
        pins=request.all_pins(),
        global_batch=request.global_batch,
        sampler=request.sampler,
        trials=request.trials,
        timeout_s=request.timeout_s,
        pareto=request.pareto,
        seed=request.seed,
        allow_numerics_changes=request.allow_numerics_changes,
        patience=SCRIPT_PATIENCE if script is not None else None,  # as `dstune tune -- <command>` has it
        dispatch=MeasureOptions(
            launcher or request.launcher,
            ray_address,
            request.warmup,
            request.steps,
            request.run_timeout,
            script=script,
            seq_len_known=script is None or seq_len_known(request.workload),
        ),
    )


def run_study_job(
    store: Store,
    job: JobRecord,
    handle: JobHandle,
    *,
    launcher: str | None = None,
    ray_address: str | None = None,
    trusted: Sequence[str | Path] = (),
) -> str:
    """The default executor: run the job as a study until its budget, or until it is cancelled (a training command
    only inside the folders ``trusted``)."""
    from tuner.measure.dispatch import Dispatcher
    from tuner.measure.op_builds import announced

    request = JobRequest.model_validate(job.request)
    settings = study_settings(request, job.study_name, launcher=launcher, ray_address=ray_address, trusted=trusted)
    tuning = TuningStudy(settings, store)
    state: dict[str, Any] = {"best_tokens_per_s": None}

    def on_event(event: Event) -> None:
        if event.status != "running":
            _log.info("job %s: %s", job.id, event.line())
        if event.status == "ok" and (event.tokens_per_s or 0) > (state["best_tokens_per_s"] or 0):
            state["best_tokens_per_s"] = event.tokens_per_s
        handle.report(
            {
                "study_id": tuning.study_id,
                "trials": tuning.configs_recorded(),
                "budget": settings.trials,
                "best_tokens_per_s": state["best_tokens_per_s"],
                "last": {"number": event.number, "status": event.status, "reason": event.reason},
            }
        )

    tuning.on_event = on_event
    handle.report({"study_id": tuning.study_id, "trials": tuning.configs_recorded(), "budget": settings.trials})
    dispatcher = Dispatcher(settings.dispatch, settings.workload.cluster.device, settings.workload.cluster.world_size)
    measurer = announced(dispatcher, settings.dispatch, lambda line: _log.info("job %s: %s", job.id, line))
    try:
        report = tuning.run(measurer, should_stop=handle.cancel_requested)
    finally:
        dispatcher.close(wait=False)
    handle.report(final_progress(store, tuning.study_id, report.counts, settings.trials))
    if report.stopped:
        return "cancelled"
    return "interrupted" if report.interrupted else "done"


def final_progress(store: Store, study_id: int, counts: dict[str, int], budget: int) -> dict[str, Any]:
    """A finished job's progress: its trials by status and its best trial, by the number the CLI and the dashboard
    give it (``best_trial_number``, from 0) and by its database id (``best_trial_id``, as ``GET
    /v1/studies/{name}/trials`` lists it)."""
    best = store.best_trial(study_id)
    return {
        "study_id": study_id,
        "trials": sum(counts.values()),
        "budget": budget,
        "counts": counts,
        "best_tokens_per_s": None if best is None else best.tokens_per_s,
        "best_trial_number": None if best is None else best.number,
        "best_trial_id": None if best is None else best.id,
    }
