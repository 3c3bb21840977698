"""``GET /v1/studies``, ``GET /v1/studies/{name}`` and ``GET /v1/studies/{name}/trials`` (paged): read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, HTTPException

from tuner.api.deps import Limit, Offset, StoreDep, StudyName
from tuner.api.readers import OPTIONAL_TOKEN, FullView, public_settings, public_workload, shown_trial
from tuner.api.responses import NOT_FOUND, READER, answers
from tuner.api.schemas import StudyDetail, StudyOut, TrialOut, TrialPage
from tuner.storage import TRIAL_ORDERS, TRIAL_STATUSES, Store, StoreError, StudyRecord
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


@router.get("/v1/studies", response_model=list[StudyOut], responses=answers(READER), openapi_extra=OPTIONAL_TOKEN)
def list_studies(store: StoreDep, full: FullView) -> list[StudyOut]:
    """Every study, newest first (without the token: the space file by its name, no other server path)."""
    return [_shown(StudyOut.of(record), full) for record in store.list_studies()]


def _shown(study: StudyOut, full: bool) -> StudyOut:
    return study if full else study.model_copy(update={"settings": public_settings(study.settings)})


@router.get(
    "/v1/studies/{name}", response_model=StudyDetail, responses=answers(READER, NOT_FOUND), openapi_extra=OPTIONAL_TOKEN
)
def get_study(name: StudyName, store: StoreDep, full: FullView) -> StudyDetail:
    """A study: its workload, trial counts by status, pruned reasons and best trial (without the token: no launch
    variables, no server path, errors as one line)."""
    record = _study(store, name)
    summary = store.study_summary(record.id)
    try:
        workload = workload_to_dict(store.workload_of(record.id))
    except StoreError:  # stored with a launch variable refused since: shown as stored (it never runs again)
        workload = store.get_workload(record.workload_id).workload
    return StudyDetail(
        study=_shown(StudyOut.of(record), full),
        workload=workload if full else public_workload(workload),
        total=summary.total,
        counts=summary.counts,
        pruned_reasons=summary.pruned_reasons,
        best=None if summary.best is None else shown_trial(TrialOut.of(summary.best), full),
    )


@router.get(
    "/v1/studies/{name}/trials",
    response_model=TrialPage,
    responses=answers(READER, NOT_FOUND),
    openapi_extra=OPTIONAL_TOKEN,
)
def study_trials(
    name: StudyName,
    store: StoreDep,
    full: FullView,
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
    shown = [shown_trial(TrialOut.of(trial), full) for trial in items]
    return TrialPage(items=shown, total=total, limit=limit, offset=offset)
