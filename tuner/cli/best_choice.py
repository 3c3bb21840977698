"""Which stored trial ``dstune best`` exports, and what it says when there is none: a ``--seq-len max`` search's
lengths are studies of their own (``NAME:LENGTH``), so a bare ``NAME`` exports the longest that trained; and
``--format hf`` exports only a config the Hugging Face Trainer trains as it was measured
(:func:`tuner.space.long_context_export.hf_problem`: Ulysses below ZeRO-3 gets sp times the gradient from the
Trainer's loss reduction), the fastest such one, or with none, exit 2 saying why and what to run. Only ``best``
exports for the Trainer: the API's and the dashboard's ds_configs are DeepSpeed's (its own loop reduces exactly)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tuner.cli.common import fail
from tuner.space.long_context_export import hf_problem

if TYPE_CHECKING:
    from tuner.storage import Store, StudyRecord, TrialRecord


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


def best_for_format(store: Store, study: StudyRecord, best: TrialRecord, format: str) -> tuple[TrialRecord, str | None]:
    """The trial to export in ``format`` and a note when it is not the study's fastest (which one, and why the faster
    one was passed over); exits 2 when no measured trial is right for the target, saying why and what to run."""
    if format != "hf" or hf_problem(best.trial) is None:
        return best, None
    for trial in store.trials(study.id, status="ok", order_by="-tokens_per_s"):
        if trial.tokens_per_s is not None and hf_problem(trial.trial) is None:
            note = (
                f"exported trial {trial.number} ({trial.tokens_per_s:,.0f} tokens/s), the fastest the Trainer trains "
                f"as measured: the fastest, trial {best.number} ({best.trial.summary()}), {hf_problem(best.trial)}"
            )
            return trial, note
    fail("format", none_right_for_hf(store, study, best))


def none_right_for_hf(store: Store, study: StudyRecord, best: TrialRecord) -> str:
    """Why no measured trial of ``study`` is right for the HF Trainer, and the runs that would measure one: ZeRO-3
    (exact under the Trainer's sequence-parallel loss reduction) added to the same study."""
    tried = [t.status for t in store.trials(study.id) if t.trial.stage == 3 and t.status != "ok"]
    outcomes = ", ".join(f"{status} {tried.count(status)}" for status in sorted(set(tried)))
    why = f"; its ZeRO-3 trials did not train ({outcomes})" if tried else "; it measured no ZeRO-3 trial"
    return (
        f"no measured config of study {study.name!r} is right for the HF Trainer: the fastest, trial {best.number} "
        f"({best.trial.summary()}), {hf_problem(best.trial)}{why}. Measure one: run the study's tune command again "
        f"with --pin stage=3 --study {study.name} (its ZeRO-3 trials join the study), then best --study {study.name} "
        "--format hf; or export --format deepspeed (dstune's own training loop reduces it exactly)"
    )


__all__ = ["best_for_format", "none_right_for_hf", "study_to_export"]
