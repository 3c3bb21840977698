"""What a reader without the API token sees of studies, trials and jobs: no launch variables, no stored command line,
no path of the server's (:func:`public_workload`, :func:`public_request`, :func:`public_error`,
:func:`public_settings`). A reader with the server's token (or any reader of a server started
``--insecure-no-auth``) sees the records whole (:func:`full_view`); a wrong token is refused (403) as on the mutating
endpoints.

Why: a launch variable may hold a setting a team keeps to itself, a stored error can quote a process listing (Ray's
out-of-memory report names the node's largest processes with their command lines) or a traceback's file paths, and
a study's settings name the server's search-space file and NVMe folder; a study of the user's training command
stores the command (its settings' ``script``), which can hold paths or a token
passed as a flag.

Example:
    >>> public_error('Traceback (most recent call last):\\n  File "/srv/x.py", line 1\\nRuntimeError: bad /srv/data')
    'RuntimeError: bad <path>'
    >>> public_settings({"space": "/srv/spaces/default.yaml", "nvme_path": "/local/nvme", "pins": {}})
    {'space': 'default.yaml', 'nvme_path': '<path>', 'pins': {}}
"""

from __future__ import annotations

import secrets
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials

from tuner.api.deps import bearer
from tuner.api.schemas import JobOut, TrialOut
from tuner.storage.public import HIDDEN, PATH, public_error

HIDDEN_COMMAND = "<command>"


def full_view(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> bool:
    """True when the reader may see records whole: the server's token, or a server without auth by choice. No token:
    False (the public view); a wrong one: 403."""
    expected = request.app.state.token
    if expected is None:
        return bool(request.app.state.insecure_no_auth)
    if credentials is None:
        return False
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(403, "invalid token")
    return True


FullView = Annotated[bool, Depends(full_view)]

# The schema's word for a reader's token: optional (``{}``: none is a valid request, answered with the public view)
OPTIONAL_TOKEN: dict[str, Any] = {"security": [{}]}  # beside the bearer scheme FastAPI lists


def public_workload(workload: dict[str, Any]) -> dict[str, Any]:
    """A workload dict (stored or as requested) without its launch variables."""
    launch = workload.get("launch")
    if not isinstance(launch, dict) or "variables" not in launch:
        return workload
    return {**workload, "launch": {key: value for key, value in launch.items() if key != "variables"}}


def public_request(body: dict[str, Any]) -> dict[str, Any]:
    """A job's request without its workload's launch variables, and its training command (``script``) hidden."""
    workload = body.get("workload")
    shown = {**body, "workload": public_workload(workload)} if isinstance(workload, dict) else body
    return {**shown, "script": HIDDEN_COMMAND} if shown.get("script") else shown


def public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A study's settings with the space file by its name and any other server path hidden."""
    shown: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "space" and isinstance(value, str):
            value = PurePath(value).name
        elif key == "script":  # a training command: its argv and folder
            value = HIDDEN_COMMAND
        elif isinstance(value, str) and PATH.fullmatch(value):
            value = HIDDEN
        shown[key] = value
    return shown


def shown_job(job: JobOut, full: bool) -> JobOut:
    """``job`` as this reader may see it."""
    if full:
        return job
    return job.model_copy(update={"request": public_request(job.request), "error": public_error(job.error)})


def shown_trial(trial: TrialOut, full: bool) -> TrialOut:
    """``trial`` as this reader may see it."""
    return trial if full else trial.model_copy(update={"error": public_error(trial.error)})


__all__ = [
    "FullView",
    "full_view",
    "public_error",
    "public_request",
    "public_settings",
    "public_workload",
    "shown_job",
    "shown_trial",
]
