"""``dstune serve``: the HTTP API and the dashboard (uvicorn), guarded by a bearer token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import fail
from tuner.cli.options import StorageOpt
from tuner.env import current as current_env
from tuner.env import storage_url

TOKEN_ENV = "DSTUNE_API_TOKEN"


def _api_token(token_file: str | None) -> str | None:
    """The API token: the file's content (stripped) when given, else ``$DSTUNE_API_TOKEN``; None when neither."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as error:
            fail("token-file", f"cannot read {token_file}: {error}")
        if not token:
            fail("token-file", f"{token_file} is empty")
        return token
    return (current_env().api_token or "").strip() or None


HostOpt = Annotated[str, typer.Option(help="Address to listen on.")]
PortOpt = Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")]
TokenFileOpt = Annotated[str | None, typer.Option(help=f"File holding the API bearer token (default: ${TOKEN_ENV}).")]
NoAuthOpt = Annotated[
    bool,
    typer.Option(
        "--insecure-no-auth", help="Allow POST/DELETE /v1/jobs without any token (or $DSTUNE_INSECURE_NO_AUTH=1)."
    ),
]
MaxBodyOpt = Annotated[
    int | None,
    typer.Option(min=1024, help="Largest request body accepted (413 above; $DSTUNE_MAX_BODY_BYTES, 1000000)."),
]
LogLevelOpt = Annotated[str, typer.Option(help="uvicorn log level.")]
WorkersOpt = Annotated[int, typer.Option(min=1, help="Server processes (uvicorn workers).")]
RecommendCacheOpt = Annotated[
    float | None,
    typer.Option(
        min=0, help="Seconds a recommendation is reused per workload (0: never; $DSTUNE_RECOMMEND_CACHE_S, 2)."
    ),
]


def serve_command(
    storage: StorageOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    token_file: TokenFileOpt = None,
    insecure_no_auth: NoAuthOpt = False,
    max_body_bytes: MaxBodyOpt = None,
    log_level: LogLevelOpt = "info",
    workers: WorkersOpt = 1,
    recommend_cache: RecommendCacheOpt = None,
) -> None:
    """Serve the HTTP API (estimate, recommend, studies, jobs) and the dashboard on the tuner's database.

    Each setting is its flag, else its DSTUNE_* variable, else the default, with one worker process or many.
    \f
    The worker processes read the resolved values (:mod:`tuner.env`) from the environment this command sets."""
    token = _api_token(token_file)
    no_auth = insecure_no_auth or current_env().insecure_no_auth
    if token is None and not no_auth:
        fail("token", f"no API token: set ${TOKEN_ENV} or --token-file (or pass --insecure-no-auth deliberately)")
    resolved = _resolved(storage, token, no_auth, max_body_bytes, recommend_cache)
    _serve(resolved, token, host=host, port=port, log_level=log_level, workers=workers)


def _resolved(
    storage: str | None, token: str | None, no_auth: bool, max_body_bytes: int | None, recommend_cache: float | None
) -> dict[str, str]:
    """Every server setting as the ``DSTUNE_*`` variable that carries it to worker processes."""
    settings = current_env()
    return {
        "DSTUNE_STORAGE": storage_url(storage),
        "DSTUNE_API_TOKEN": token or "",
        "DSTUNE_INSECURE_NO_AUTH": "1" if no_auth else "0",
        "DSTUNE_MAX_BODY_BYTES": str(settings.max_body_bytes if max_body_bytes is None else max_body_bytes),
        "DSTUNE_RECOMMEND_CACHE_S": str(settings.recommend_cache_s if recommend_cache is None else recommend_cache),
    }


def _serve(resolved: dict[str, str], token: str | None, *, host: str, port: int, log_level: str, workers: int) -> None:
    """Run uvicorn: the app in this process with one worker; else migrated once here, each worker opening its own."""
    import uvicorn

    from tuner.api import create_app

    if workers == 1:
        application = create_app(
            resolved["DSTUNE_STORAGE"],
            token,
            insecure_no_auth=resolved["DSTUNE_INSECURE_NO_AUTH"] == "1",
            max_body_bytes=int(resolved["DSTUNE_MAX_BODY_BYTES"]),
            recommend_cache_s=float(resolved["DSTUNE_RECOMMEND_CACHE_S"]),
            freeze_gc=True,
            request_budget_s=current_env().request_budget_s,
        )
        uvicorn.run(application, host=host, port=port, log_level=log_level)
        return
    create_app(resolved["DSTUNE_STORAGE"], token).state.store.close()  # migrated once; each worker opens its own
    os.environ.update(resolved)
    uvicorn.run(
        "tuner.api.app:create_app_from_env", factory=True, host=host, port=port, log_level=log_level, workers=workers
    )
