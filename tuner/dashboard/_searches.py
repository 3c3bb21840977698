"""The home page's length searches: ``dstune tune --seq-len max`` records each length it measures as a study of its
own (``NAME:LENGTH``, settings ``seq_len_search: NAME``, :mod:`tuner.study.length_runs`); the dashboard shows them
as one search, its lengths in order with how each run ended, not as unrelated workloads."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.dashboard._views import describe_workload
from tuner.storage import Store, StudyRecord, TrialRecord, WorkloadRecord

SEARCH_KEY = "seq_len_search"  # the study settings' key naming the search a length study belongs to


def search_name(study: StudyRecord) -> str | None:
    """The length search ``study`` records one length of (None: a study of its own)."""
    name = (study.settings or {}).get(SEARCH_KEY)
    return name if isinstance(name, str) and isinstance(study.settings.get("seq_len"), int) else None


@dataclass(frozen=True)
class LengthRun:
    """One length of a search: its study and its one run (None while it has none)."""

    seq_len: int
    study: StudyRecord
    trial: TrialRecord | None

    @property
    def status(self) -> str:
        return self.trial.status if self.trial is not None else "pending"


@dataclass
class LengthSearch:
    """A ``--seq-len max`` search: its name, the workload at its longest length run, and its lengths in order."""

    name: str
    workload: WorkloadRecord
    runs: list[LengthRun] = field(default_factory=list)

    @property
    def description(self) -> str:
        """The workload without its length (each run has its own)."""
        return describe_workload(self.workload, with_length=False)

    @property
    def longest_ok(self) -> LengthRun | None:
        """The longest length whose run trained within the memory (status ok)."""
        return max((run for run in self.runs if run.status == "ok"), key=lambda run: run.seq_len, default=None)


def length_searches(store: Store, studies: list[StudyRecord]) -> list[LengthSearch]:
    """The length searches among ``studies``, by name, each with its lengths in increasing order."""
    found: dict[str, LengthSearch] = {}
    for study in studies:
        name = search_name(study)
        if name is None:
            continue
        trials = store.trials(study.id, order_by="number")
        run = LengthRun(int(study.settings["seq_len"]), study, trials[-1] if trials else None)
        search = found.get(name)
        if search is None:
            search = found[name] = LengthSearch(name, store.get_workload(study.workload_id))
        search.runs.append(run)
        if run.seq_len == max(r.seq_len for r in search.runs):
            search.workload = store.get_workload(study.workload_id)
    for search in found.values():
        search.runs.sort(key=lambda run: run.seq_len)
    return sorted(found.values(), key=lambda search: search.name)


__all__ = ["LengthRun", "LengthSearch", "length_searches", "search_name"]
