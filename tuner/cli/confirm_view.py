"""``dstune tune --confirm``: the study's winner run once more, independently, and what that run measured recorded
beside it (:mod:`tuner.study.confirm`); the line ``best`` and the report print for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from tuner.storage import Store, TrialRecord
    from tuner.study import StudySettings

ConfirmOpt = Annotated[
    bool | None,
    typer.Option(
        "--confirm/--no-confirm",
        help="After the study, run the winner once more (a fresh run, same command and launcher) and record its "
        "throughput beside the trial's. Default: on for a training command after --, off for dstune's trainer.",
        show_default=False,
    ),
]


def confirm_winner(settings: StudySettings, store: Store, study_id: int, console: Console) -> None:
    """Confirm the study's best trial with an independent run through the study's own launcher, saying so first."""
    from tuner.measure.dispatch import Dispatcher
    from tuner.study import confirm_best, confirmation_options, recorded_confirmation

    best = store.best_trial(study_id)
    if best is None or recorded_confirmation(best) is not None:
        return
    options = confirmation_options(best, settings.dispatch)
    console.print(
        f"confirming the winner (trial {best.number}, {best.tokens_per_s or 0:,.0f} tokens/s) with an independent run "
        f"of {options.steps} timed steps",
        highlight=False,
    )
    cluster = settings.workload.cluster
    dispatcher = Dispatcher(options, cluster.device, cluster.world_size)
    try:
        confirm_best(store, study_id, settings.workload, dispatcher)
    finally:
        dispatcher.close(wait=False)


def confirmation_notes(best: TrialRecord) -> list[str]:
    """The winner's confirmation line as a note of ``best``'s export (none without one)."""
    from tuner.study import recorded_confirmation

    confirmation = recorded_confirmation(best)
    return [confirmation.line()] if confirmation is not None else []


def print_confirmation(best: TrialRecord, console: Console) -> None:
    """The winner's confirmation line, when it has one."""
    from tuner.study import recorded_confirmation

    confirmation = recorded_confirmation(best)
    if confirmation is not None:
        style = None if confirmation.holds else "yellow"
        console.print(confirmation.line(), style=style, highlight=False, soft_wrap=True, markup=False)
