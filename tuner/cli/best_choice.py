"""Which stored trial ``dstune best`` exports, and what it says when there is none: a ``--seq-len max`` search's
lengths are studies of their own (``NAME:LENGTH``), so a bare ``NAME`` exports the longest that trained; and
``--format hf`` exports only a config the Hugging Face Trainer trains as it was measured
(:func:`tuner.space.long_context_export.hf_problem`: Ulysses below ZeRO-3 gets sp times the gradient from the
Trainer's loss reduction), the fastest such one."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import typer

from tuner.cli.common import fail
from tuner.space.long_context_export import hf_problem

if TYPE_CHECKING:
    from tuner.storage import Store, StudyRecord, TrialRecord

NONE_RIGHT_EXIT = 1  # a valid question whose answer is "no measured config is right for that target"


def study_to_export(store: Store, name: str) -> tuple[StudyRecord, str | None]:
    """The study ``dstune best --study NAME`` exports from, and a note when it is not the one named: a ``--seq-len
    max`` search records each length as a study of its own (``NAME:LENGTH``), so its bare name exports the search's
    answer, the longest length whose run trained within the memory. Exits 2 naming the field when there is neither
    (a search whose lengths all ran out of memory lists them)."""
    record = store.get_study(name)
    if record is not None:
        return record, None
    pattern = re.compile(rf"{re.escape(name)}:(\d+)")
    lengths = sorted(
        ((int(found.group(1)), s) for s in store.list_studies() if (found := pattern.fullmatch(s.name))),
        key=lambda length: length[0],
        reverse=True,
    )
    shown = ", ".join(study.name for _, study in lengths[:4]) + (", ..." if len(lengths) > 4 else "")
    for length, study in lengths:
        if store.best_trial(study.id) is not None:
            return study, (
                f"{name} is a --seq-len max search, each length a study of its own ({shown}): exported {study.name}, "
                f"the longest length that trained within the memory ({length:,} tokens)"
            )
    if lengths:
        fail("study", f"no length of the --seq-len max search {name} trained within the memory yet: {shown}")
    fail("study", f"no study named {name!r} in {store.url}")


def best_for_format(store: Store, study_id: int, best: TrialRecord, format: str) -> tuple[TrialRecord, str | None]:
    """The trial to export in ``format`` and a note when it is not the study's fastest; exits 1 when no measured
    trial is right for the target, saying why."""
    if format != "hf" or hf_problem(best.trial) is None:
        return best, None
    for trial in store.trials(study_id, status="ok", order_by="-tokens_per_s"):
        if trial.tokens_per_s is not None and hf_problem(trial.trial) is None:
            note = (
                f"exported trial {trial.number} ({trial.tokens_per_s:,.0f} tokens/s), the fastest the Trainer trains "
                f"as measured: the fastest, trial {best.number} ({best.trial.summary()}), {hf_problem(best.trial)}"
            )
            return trial, note
    typer.echo(
        f"error: format: no measured config of this study is right for the HF Trainer: the fastest, trial "
        f"{best.number}, {hf_problem(best.trial)}; measure one at ZeRO-3 (tune --pin stage=3) or export "
        "--format deepspeed (dstune's own training loop reduces it exactly)",
        err=True,
    )
    raise typer.Exit(NONE_RIGHT_EXIT)


__all__ = ["NONE_RIGHT_EXIT", "best_for_format", "study_to_export"]
