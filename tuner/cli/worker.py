"""``dstune worker``: take queued tuning jobs from the database and run them as studies (or submit them to Ray)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import fail
from tuner.cli.options import StorageOpt
from tuner.requests import Launcher

AllowScriptsOpt = Annotated[
    list[Path] | None,
    typer.Option(
        help="A folder whose training commands this worker may run (jobs queued with dstune queue -- <command>; "
        "repeatable). Without it a job with a command fails, unrun.",
        exists=True,
        file_okay=False,
        resolve_path=True,
    ),
]


def log_to_stderr() -> None:
    """dstune's own log lines (each job started and ended, each trial's outcome) on stderr, one a line: what a
    terminal, a file or systemd's journal shows of a worker."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("tuner")
    if not any(getattr(h, "dstune_worker", False) for h in logger.handlers):
        handler.dstune_worker = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def worker_command(
    storage: StorageOpt = None,
    once: Annotated[
        bool,
        typer.Option(help="Exit when the queue is empty (with --submit: and its jobs have ended) instead of polling."),
    ] = False,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between looks at an empty queue.")] = 5.0,
    name: Annotated[
        str | None, typer.Option(help="Worker name recorded on its jobs (default host:pid:thread).")
    ] = None,
    job: Annotated[int | None, typer.Option(min=1, help="Run this one job (what a Ray submission runs).")] = None,
    launcher: Annotated[Launcher | None, typer.Option(help="Override the jobs' launcher.")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster for the trials; with --submit, the Ray Jobs API address.")
    ] = None,
    submit: Annotated[
        bool, typer.Option(help="Submit each job to the Ray cluster (Jobs API at --ray-address) instead of running it.")
    ] = False,
    allow_scripts: AllowScriptsOpt = None,
) -> None:
    """Take queued tuning jobs from the database and run them as studies (or submit them to a Ray cluster)."""
    from tuner.env import storage_url
    from tuner.storage import Store, StoreError
    from tuner.worker import run_job, run_study_job, submit_loop, work

    log_to_stderr()
    url = storage_url(storage)
    store = Store.open(url)
    if submit:
        if allow_scripts:
            fail(
                "allow-scripts", "not with --submit: the cluster's dstune worker --job runs the job, and trusts nothing"
            )
        if not ray_address:
            fail("ray-address", "--submit needs the Ray Jobs API address, e.g. http://HEAD:8265")
        try:
            submitted = submit_loop(store, ray_address, url, once=once, poll=poll, name=name, launcher=launcher)
        except ConnectionError as error:  # no Jobs API at that address
            fail("ray-address", str(error))
        typer.echo(f"submitted {len(submitted)} job(s) to {ray_address}")
        return
    trusted = tuple(allow_scripts or ())
    executor = functools.partial(run_study_job, launcher=launcher, ray_address=ray_address, trusted=trusted)
    if job is not None:
        try:
            status = run_job(store, job, executor)
        except StoreError as error:
            fail(error.field, error.message)
        typer.echo(f"job {job}: {status}")
        raise typer.Exit(0 if status in ("done", "cancelled") else 1)
    try:
        ran = work(store, name, executor, once=once, poll=poll)
    except KeyboardInterrupt:
        typer.echo("interrupted: the running job is marked failed; its finished trials are recorded", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"ran {len(ran)} job(s)")
