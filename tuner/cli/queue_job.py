"""``dstune queue``: queue a tuning job from the command line, as ``POST /v1/jobs`` does, for a ``dstune worker`` to
run. The job is the API's request body (``JobRequest``: a workload, a space, pins, a budget...), read from a JSON
file; it is checked as the API checks it (the workload built, the space and pins loaded) before anything is stored,
and a bad field is one line naming it, exit 2.

With a training command after ``--`` (``dstune queue JOB.json -- deepspeed train.py --deepspeed ds.json``) the job
measures that command as ``dstune tune -- <command>`` would (a workload without a model: the command's own, nothing
pruned before a run, as tune without ``--model``): its ds_config is found and read here, and the job is run
only by a worker that trusts the command's folder (``dstune worker --allow-scripts DIR``). This is the one way such a
job is queued: the API refuses one (403), since whoever queues it decides what code the worker runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.cli.common import fail
from tuner.cli.options import StorageOpt
from tuner.cli.script_options import ArgMappingOpt, CommandArg, DsConfigAtOpt


def queue_command(
    job: Annotated[
        Path, typer.Argument(help="The job as JSON: the body POST /v1/jobs takes (workload, space, pins, trials...).")
    ],
    storage: StorageOpt = None,
    ds_config_at: DsConfigAtOpt = None,
    arg_mapping: ArgMappingOpt = None,
    command: CommandArg = None,
) -> None:
    """Queue a tuning job (the body of POST /v1/jobs, as a JSON file) for dstune worker; with a training command
    after --, a job that measures it (run by a worker started with --allow-scripts)."""
    from tuner.env import storage_url
    from tuner.requests import JobRequest, check_job, validated
    from tuner.requests.command_workload import seq_len_known
    from tuner.storage import Store

    body = _job_body(job)
    if "script" in body:
        fail("script", "give the training command after -- (dstune queue JOB.json -- <command>), not in the file")
    if command:
        body = _with_script(body, command, ds_config_at, arg_mapping)
    elif ds_config_at or arg_mapping:
        fail("ds-config-at" if ds_config_at else "arg-mapping", "only with a training command after --")
    request = validated(JobRequest, body)
    name = check_job(request)
    record = request.model_dump(mode="json")
    if request.script is not None and not seq_len_known(request.workload):
        record["workload"].pop("seq_len")  # left unset: tokens per sample only from what the command's forward saw
    queued = Store.open(storage_url(storage)).enqueue_job(name, record)
    runs = "; dstune worker --allow-scripts <its folder> runs it" if request.script else "; dstune worker runs it"
    typer.echo(f"queued job {queued.id} (study {name}){runs}")


def _job_body(job: Path) -> dict[str, Any]:
    """The job file's object (exit 2 when it cannot be read or is not a JSON object)."""
    try:
        body = json.loads(job.read_text())
    except OSError as error:
        fail("job", f"cannot read {job}: {error.strerror}")
    except (json.JSONDecodeError, RecursionError) as error:  # RecursionError: nested past the parser's limit
        fail("job", f"{job} is not JSON: {error}")
    if not isinstance(body, dict):
        fail("job", f"{job} must hold a JSON object (the body of POST /v1/jobs)")
    return body


def _with_script(
    body: dict[str, Any], command: list[str], ds_config_at: str | None, arg_mapping: list[str] | None
) -> dict[str, Any]:
    """The job measuring ``command``: the command, its ds_config's precision, the pins of what a command decides for
    itself, and a study name of its own (as ``dstune tune -- <command>`` gives them)."""
    from tuner.cli.script_model import say_no_model
    from tuner.cli.script_options import script_command, script_pin_values, script_precision, script_study_name
    from tuner.requests import JobRequest, default_study_name, job_workload, validated
    from tuner.requests.script_job import ScriptJob

    script = script_command(command, ds_config_at, arg_mapping)
    assert script is not None
    workload = dict(body.get("workload") or {})
    no_model = not any(workload.get(key) is not None for key in ("model", "config", "params"))
    if no_model:  # as `dstune tune -- <command>` without --model: nothing pruned, the boundary learned from runs
        say_no_model()
    precision = script_precision(script)
    if precision is not None:
        workload["precision"] = precision
    job = {**body, "workload": workload, "script": ScriptJob.of(script).model_dump()}
    job["pins"] = {**script_pin_values(str(body.get("space", "default"))), **(body.get("pins") or {})}
    if body.get("study") is None:
        request = validated(JobRequest, job)
        default = default_study_name(job_workload(request, ("workload",)))
        # a command's own model is named by the command already (tuner.workload.unknown_model), as tune names it
        job["study"] = default if no_model else script_study_name(default, script)
    return job
