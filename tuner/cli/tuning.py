"""The steps of ``dstune tune``: open the study (a refusal is one line naming the field), run it with a live
progress bar, show what it found, and say how it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.cli.common import fail
from tuner.cli.confirm_view import confirm_winner
from tuner.cli.study_view import render_study, warn_slow_runs

if TYPE_CHECKING:
    from tuner.storage import Store
    from tuner.study import StudyReport, StudySettings, TuningStudy


def run_tune(settings: StudySettings, storage: str | None, confirm: bool | None = False) -> int:
    """Run a study to its budget, confirm its winner with an independent run (``confirm``; None: for a training
    command's study; never after an interruption) and print the top configs; 0 when a config was measured, 1
    otherwise."""
    console = Console()
    store, tuning = open_study(settings, storage)
    if settings.workload.cluster.device == "cpu":
        warn_slow_runs(tuning, settings.dispatch.warmup, settings.dispatch.steps, console)
    report = run_with_progress(tuning, console)
    if confirm is None:
        confirm = settings.dispatch.script is not None
    if confirm and not (report.interrupted or report.stopped):
        confirm_winner(settings, store, tuning.study_id, console)
    render_study(store, tuning.study_id, settings.name, console)
    say_how_it_ended(tuning, report, console)
    return 0 if store.best_trial(tuning.study_id) is not None else 1


def open_study(settings: StudySettings, storage: str | None) -> tuple[Store, TuningStudy]:
    """The store and the study (created, or resumed); a bad space, config or store is one line and exit code 2."""
    from tuner.env import storage_url
    from tuner.estimator import ConfigError
    from tuner.space import SpaceError
    from tuner.storage import Store, StoreError
    from tuner.study import TuningStudy

    try:
        store = Store.open(storage_url(storage))
        return store, TuningStudy(settings, store)
    except SpaceError as error:
        fail("space", str(error))
    except (ConfigError, StoreError) as error:
        fail(error.field, error.message)


def run_with_progress(tuning: TuningStudy, console: Console) -> StudyReport:
    """Run the study through the dispatcher, with a progress bar (configs recorded, best tokens/s so far)."""
    from tuner.measure.dispatch import Dispatcher
    from tuner.measure.op_builds import announced
    from tuner.measure.script.failures import ScriptFailed
    from tuner.study import Event, Measurer

    settings = tuning.settings
    best = {"tokens": 0.0}
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[best]}"))
    with Progress(TextColumn("[bold]{task.description}"), *columns, console=console, transient=True) as progress:
        task = progress.add_task(f"study {settings.name}", total=settings.trials, best="")

        def on_event(event: Event) -> None:
            if event.status == "running":
                return
            if not console.is_terminal:  # a file, a pipe, a journal: no live bar there, one line per trial instead
                console.print(event.line(), highlight=False, soft_wrap=True, markup=False)
            if event.status == "ok" and (event.tokens_per_s or 0) > best["tokens"]:
                best["tokens"] = event.tokens_per_s or 0.0
            progress.update(
                task,
                completed=tuning.configs_recorded(),
                best=f"best {best['tokens']:,.0f} tokens/s" if best["tokens"] else "",
            )

        tuning.on_event = on_event
        cluster, options = settings.workload.cluster, settings.dispatch
        dispatcher = Dispatcher(options, cluster.device, cluster.world_size)
        measurer: Measurer = announced(
            dispatcher, options, lambda line: console.print(line, highlight=False, soft_wrap=True, markup=False)
        )
        try:
            return tuning.run(measurer)
        except ScriptFailed as failed:  # the command failed on its own at its first trial: the study stops
            progress.stop()
            fail(failed.field, failed.message)
        finally:
            dispatcher.close(wait=False)


def say_how_it_ended(tuning: TuningStudy, report: StudyReport, console: Console) -> None:
    """Say when the study was interrupted (how to resume it) or its space ran out of new configs."""
    if report.interrupted:
        console.print("[yellow]interrupted[/]: finished trials are recorded; run the same command to resume")
    if report.settled:
        console.print(
            f"stopped: the best config stood for {tuning.settings.patience} measured trials after it "
            "(--patience; more trials are unlikely to beat it)",
            highlight=False,
        )
    if report.exhausted:
        recorded = tuning.configs_recorded()
        console.print(
            f"the search space has no new config to offer: {recorded} distinct configs recorded, fewer than the "
            f"{tuning.settings.trials} asked for (the sampler's last proposals all repeated recorded ones)",
            highlight=False,
        )
