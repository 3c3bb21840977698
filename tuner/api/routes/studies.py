"""``GET /v1/studies``, ``GET /v1/studies/{name}`` and ``GET /v1/studies/{name}/trials`` (paged): read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, HTTPException

from tuner.api.deps import Limit, Offset, StoreDep, StudyName
from tuner.api.responses import NOT_FOUND, answers
from tuner.api.schemas import StudyDetail, StudyOut, TrialOut, TrialPage
from tuner.storage import TRIAL_ORDERS, TRIAL_STATUSES, Store, StudyRecord
from tuner.workload import workload_to_dict

if TYPE_CHECKING:
    TrialOrder = str
else:  # a Literal built from the store's orders, so the OpenAPI schema lists them
    TrialOrder = Literal[tuple(TRIAL_ORDERS) + tuple(f"-{name}" for name in TRIAL_ORDERS)]
TrialStatus = Literal[TRIAL_STATUSES]  # type: ignore[valid-type]

router = APIRouter(tags=["studies"])


def _study(store: Store, name: str) -> StudyRecord:
    record = store.get_study(name)
    if record is None:
        raise HTTPException(404, f"no study named {name!r}")
    return record


@router.get("/v1/studies", response_model=list[StudyOut], responses=answers())
def list_studies(store: StoreDep) -> list[StudyOut]:
    """Every study, newest first."""
    return [StudyOut.of(record) for record in store.list_studies()]


@router.get("/v1/studies/{name}", response_model=StudyDetail, responses=answers(NOT_FOUND))
def get_study(name: StudyName, store: StoreDep) -> StudyDetail:
    """A study: its workload, trial counts by status, pruned reasons and best trial."""
    record = _study(store, name)
    summary = store.study_summary(record.id)
    return StudyDetail(
        study=StudyOut.of(record),
        workload=workload_to_dict(store.workload_of(record.id)),
        total=summary.total,
        counts=summary.counts,
        pruned_reasons=summary.pruned_reasons,
        best=None if summary.best is None else TrialOut.of(summary.best),
    )


@router.get("/v1/studies/{name}/trials", response_model=TrialPage, responses=answers(NOT_FOUND))
def study_trials(
    name: StudyName,
    store: StoreDep,
    status: TrialStatus | None = None,
    order_by: TrialOrder = "number",
    limit: Limit = 100,
    offset: Offset = 0,
) -> TrialPage:
    """A page of a study's trials, optionally of one status, sorted by ``order_by`` (``-`` for descending)."""
    record = _study(store, name)
    summary = store.study_summary(record.id)
    total = summary.total if status is None else summary.counts.get(status, 0)
    items = store.trials(record.id, status=status, order_by=order_by, limit=limit, offset=offset)
    return TrialPage(items=[TrialOut.of(t) for t in items], total=total, limit=limit, offset=offset)
