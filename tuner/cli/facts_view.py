"""What the CLI prints beside a study's winner of the choices it makes that change the numerics (a study allowed to
make them: ``tune --allow-numerics-changes``), as :func:`tuner.study.numerics_facts` reads them: the same notes
``best``'s export prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from tuner.storage import TrialRecord


def print_numerics(best: TrialRecord, console: Console) -> None:
    """The winner's numerics notes, one line each (none for fp32-master Adam with the model's own loss)."""
    from tuner.study import numerics_facts

    for note in numerics_facts(best.trial).notes:
        console.print(note, highlight=False, soft_wrap=True, markup=False)
