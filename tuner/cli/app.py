"""The ``dstune`` Typer app: the ``--version`` callback and one command per module.

Every bad input ends the same way: one line ``error: <field>: <message>`` on stderr, exit code 2
(:mod:`tuner.cli.common`).
"""

from __future__ import annotations

import atexit
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from tuner.cli.common import OneLineErrorGroup
from tuner.cli.estimate import estimate_command
from tuner.cli.measure import measure_command
from tuner.cli.queue_job import queue_command
from tuner.cli.serve import serve_command
from tuner.cli.tune import best_command, tune_command
from tuner.cli.worker import worker_command

app = typer.Typer(
    cls=OneLineErrorGroup,
    help="Auto-tuning search for DeepSpeed training configurations.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's help: option names and help wrap at any width, never cut at 80 columns
)


def _version_callback(value: bool) -> None:
    if value:
        try:
            typer.echo(version("dstune"))
        except PackageNotFoundError:
            typer.echo("unknown")
        raise typer.Exit()


MEASURING_COMMANDS = frozenset({"measure", "tune", "worker"})  # commands whose runs fork ranks from a node's server


def _release_fork_servers() -> None:
    """At exit of a command that measured: the node's fork servers it used leave once nobody else uses them,
    instead of idling on for ``DSTUNE_FORKSERVER_IDLE_S`` (nothing of a finished command stays behind)."""
    from tuner.measure.forkserver import release_node_servers

    release_node_servers()


@app.callback()
def main(
    ctx: typer.Context,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Auto-tuning search for DeepSpeed training configurations."""
    if ctx.invoked_subcommand in MEASURING_COMMANDS:
        atexit.unregister(_release_fork_servers)  # once, however often the app runs in one process
        atexit.register(_release_fork_servers)
        from tuner.measure.op_builds import use_environment_builds

        use_environment_builds()  # this environment's op builds, for every rank, fork server and local Ray worker


app.command("estimate")(estimate_command)
app.command("measure")(measure_command)
app.command("tune")(tune_command)
app.command("best")(best_command)
app.command("serve")(serve_command)
app.command("worker")(worker_command)
app.command("queue")(queue_command)

__all__ = ["app"]
