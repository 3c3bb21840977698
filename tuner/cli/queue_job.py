"""``dstune queue``: queue a tuning job from the command line, as ``POST /v1/jobs`` does, for a ``dstune worker`` to
run. The job is the API's request body (``JobRequest``: a workload, a space, pins, a budget...), read from a JSON
file; it is checked as the API checks it (the workload built, the space and pins loaded) before anything is stored,
and a bad field is one line naming it, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import fail
from tuner.cli.options import StorageOpt


def queue_command(
    job: Annotated[
        Path, typer.Argument(help="The job as JSON: the body POST /v1/jobs takes (workload, space, pins, trials...).")
    ],
    storage: StorageOpt = None,
) -> None:
    """Queue a tuning job (the body of POST /v1/jobs, as a JSON file) for dstune worker."""
    from tuner.env import storage_url
    from tuner.requests import JobRequest, check_job, validated
    from tuner.storage import Store

    try:
        body = json.loads(job.read_text())
    except OSError as error:
        fail("job", f"cannot read {job}: {error.strerror}")
    except (json.JSONDecodeError, RecursionError) as error:  # RecursionError: nested past the parser's limit
        fail("job", f"{job} is not JSON: {error}")
    if not isinstance(body, dict):
        fail("job", f"{job} must hold a JSON object (the body of POST /v1/jobs)")
    request = validated(JobRequest, body)
    name = check_job(request)
    queued = Store.open(storage_url(storage)).enqueue_job(name, request.model_dump(mode="json"))
    typer.echo(f"queued job {queued.id} (study {name}); dstune worker runs it")
