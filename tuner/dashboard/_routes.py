"""The dashboard's routes: server-rendered Jinja2 pages, ds_config downloads and the static assets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from tuner.dashboard import _views as views
from tuner.dashboard._apart import tell_apart, trial_differences
from tuner.dashboard._searches import LengthSearch, length_searches, search_name
from tuner.errors import InputError
from tuner.forecast import describe_reason
from tuner.measure.script.answer import public_answer, script_answer
from tuner.requests import readable_name
from tuner.storage import Store, StudyRecord, TrialRecord
from tuner.storage.public import public_error
from tuner.study import answer_facts
from tuner.units import format_bytes

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
JOBS_SHOWN = 50  # the newest tuning jobs on the home page
ACTIVE_JOB_STATUSES = ("queued", "running", "cancel_requested")
REFRESH_S = 30  # the home page reloads itself this often while a job is queued or running
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".md": "text/markdown"}

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(
    bytes=format_bytes,
    rate=views.format_rate,
    percent=views.format_percent,
    time=views.format_time,
    config=views.describe_config,
    sortval=views.sort_value,
    reason=describe_reason,
    public=public_error,  # the pages are open: errors as one line, no command lines, no paths
    urlpart=lambda value: quote(str(value), safe=""),
)

router = APIRouter(include_in_schema=False)


def _store(request: Request) -> Store:
    return request.app.state.store


def _base(request: Request) -> str:
    """The path prefix the app is served under (``root_path``), so links work behind a proxy."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"base": _base(request), **context}, status_code=status_code)


def _not_found(request: Request, message: str) -> HTMLResponse:
    return _page(request, "not_found.html", {"title": "Not found", "message": message}, status_code=404)


@router.get("/", response_class=HTMLResponse, name="dashboard_home")
def home(request: Request) -> HTMLResponse:
    """Every workload with its best measured config over all its studies."""
    store = _store(request)
    rows: dict[int, views.WorkloadSummary] = {}
    listed = store.list_studies()
    for study in listed:
        if search_name(study) is not None:  # one length of a --seq-len max search: shown with its search
            continue
        row = rows.get(study.workload_id)
        if row is None:
            row = rows[study.workload_id] = views.WorkloadSummary(store.get_workload(study.workload_id))
        summary = store.study_summary(study.id)
        row.studies.append(study)
        row.total += summary.total
        row.pruned += summary.counts["pruned"]
        row.measured += sum(summary.counts[status] for status in views.MEASURED_STATUSES)
        best = summary.best
        if best is not None and (row.best is None or (best.tokens_per_s or 0) > (row.best.tokens_per_s or 0)):
            row.best, row.best_study = best, study
    ordered = sorted(rows.values(), key=lambda r: (r.workload.model_name, r.workload.id))
    searches = length_searches(store, listed)
    studies = {study.name for study in listed}
    jobs = [views.JobView(job, job.study_name in studies) for job in store.list_jobs(limit=JOBS_SHOWN)]
    active = any(view.job.status in ACTIVE_JOB_STATUSES for view in jobs)
    context = {"title": "dstune", "rows": ordered, "jobs": jobs, "refresh_s": REFRESH_S if active else None,
               "searches": searches, "rows_apart": tell_apart([(row.description, row.workload) for row in ordered]),
               "searches_apart": tell_apart([(s.description, s.workload) for s in searches])}  # fmt: skip
    return _page(request, "home.html", context)


def _stored_study(store: Store, name: str) -> StudyRecord | None:
    """The study called ``name``; None also for a name no study can have (a NUL, a control character, longer than
    the column), which never reaches the database."""
    try:
        readable_name(name, "name")
    except InputError:
        return None
    return store.get_study(name)


def _study_trial(request: Request, name: str, number: int) -> tuple[StudyRecord, TrialRecord] | HTMLResponse:
    """A study's trial by number, or the not-found page naming what is missing."""
    store = _store(request)
    study = _stored_study(store, name)
    if study is None:
        return _not_found(request, f"There is no study called {name!r}.")
    trial = next((t for t in store.trials(study.id, order_by="number") if t.number == number), None)
    if trial is None:
        return _not_found(request, f"Study {name!r} has no trial {number}.")
    return study, trial


# Registered before the study page: study names may hold "/", so the study route matches any path below /studies/.
@router.get("/studies/{name:path}/trials/{number:int}/ds_config.json", name="dashboard_ds_config")
def download_ds_config(request: Request, name: str, number: int) -> Response:
    """A trial's ds_config as a JSON attachment, ready for ``deepspeed --deepspeed_config``."""
    found = _study_trial(request, name, number)
    if isinstance(found, HTMLResponse):
        return found
    study, trial = found
    if not trial.ds_config:
        return _not_found(request, f"Trial {number} has no ds_config: the search space rejected its parameters.")
    filename = f"ds_config_{quote(study.name, safe='')}_trial{number}.json"
    script = _script(trial)  # a training command's trial: the config the command got, its own sections included
    return Response(
        json.dumps(script["ds_config"] if script else trial.trial.deepspeed_config(), indent=2, sort_keys=True) + "\n",
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.get("/studies/{name:path}/trials/{number:int}", response_class=HTMLResponse, name="dashboard_trial")
def trial_page(request: Request, name: str, number: int) -> HTMLResponse:
    """One trial: its config, outcome and rank report (where each rank ran, its peaks and step times)."""
    found = _study_trial(request, name, number)
    if isinstance(found, HTMLResponse):
        return found
    study, trial = found
    context = {
        "title": f"{study.name} trial {number} · dstune",
        "study": study,
        "trial": trial,
        "ranks": views.rank_rows(trial.measurement),
        "cost": views.cost_rows(trial.measurement),
        "breakdown": views.breakdown_rows(trial.measurement),
        "numerics": views.numerics_rows(trial.measurement),
        "numerics_check": ((trial.measurement or {}).get("numerics") or {}),
        "stopped_early": views.stopped_early(trial),
        "script": _script(trial),
        "facts": answer_facts(trial),
    }
    return _page(request, "trial.html", context)


def _script(trial: TrialRecord | None) -> dict[str, Any] | None:
    """The answer of a trial measured with the user's training command (None for dstune's own trainer), without the
    command: the pages are open, and a command may hold paths or a token passed as a flag."""
    return public_answer(script_answer(((trial.measurement if trial else None) or {}).get("script")))


@router.get("/studies/{name:path}", response_class=HTMLResponse, name="dashboard_study")
def study_page(request: Request, name: str) -> HTMLResponse:
    """One study: its progress, the throughput/memory trade-off, estimate quality (memory and throughput), prune
    reasons and every trial."""
    store = _store(request)
    study = _stored_study(store, name)
    if study is None:
        return _not_found(request, f"There is no study called {name!r}.")
    workload = store.get_workload(study.workload_id)
    summary = store.study_summary(study.id)
    trials = store.trials(study.id, order_by="number")
    context = {
        "title": f"{study.name} · dstune",
        "study": study,
        "workload": workload,
        "workload_text": views.describe_workload(workload),
        "summary": summary,
        "counts": {status: count for status, count in summary.counts.items() if count},
        "best": summary.best,
        "best_headroom": views.headroom(summary.best, workload.gpu_memory),
        "script": _script(summary.best),
        "facts": answer_facts(summary.best) if summary.best is not None else None,
        "trials": trials,
        "differences": trial_differences(trials),
        "quality": views.estimate_quality(trials),
        "throughput": views.throughput_accuracy(trials),
        "charts": views.chart_data(trials, summary.pruned_reasons, workload.gpu_memory),
        "search": _search_of(store, study),
    }
    return _page(request, "study.html", context)


def _search_of(store: Store, study: StudyRecord) -> LengthSearch | None:
    """The ``--seq-len max`` search ``study`` records one length of, with all its lengths (None: a study of its own)."""
    name = search_name(study)
    if name is None:
        return None
    found = length_searches(store, [s for s in store.list_studies() if search_name(s) == name])
    return found[0] if found else None


@router.get("/static/{filename}", name="dashboard_static")
def static(filename: str) -> FileResponse:
    """The dashboard's own CSS and JavaScript, and the vendored Chart.js (no CDN: the pages work offline)."""
    path = STATIC_DIR / filename
    if "/" in filename or filename.startswith(".") or not path.is_file():
        raise HTTPException(status_code=404, detail="no such file")
    return FileResponse(path, media_type=STATIC_TYPES.get(path.suffix, "application/octet-stream"))
