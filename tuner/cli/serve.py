"""``dstune serve``: the HTTP API and the dashboard (uvicorn), guarded by a bearer token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import fail
from tuner.cli.options import StorageOpt

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
    return os.environ.get(TOKEN_ENV, "").strip() or None


def serve_command(
    storage: StorageOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    token_file: Annotated[
        str | None, typer.Option(help=f"File holding the API bearer token (default: ${TOKEN_ENV}).")
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow POST/DELETE /v1/jobs without any token.")
    ] = False,
    max_body_bytes: Annotated[
        int, typer.Option(min=1024, help="Largest request body accepted (413 above).")
    ] = 1_000_000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    workers: Annotated[int, typer.Option(min=1, help="Server processes (uvicorn workers).")] = 1,
    recommend_cache: Annotated[
        float, typer.Option(min=0, help="Seconds a recommendation is reused per workload (0: never).")
    ] = 2.0,
) -> None:
    """Serve the HTTP API (estimate, recommend, studies, jobs) on the tuner's database."""
    import uvicorn

    from tuner.api import create_app
    from tuner.storage import default_url

    token = _api_token(token_file)
    if token is None and not insecure_no_auth:
        fail("token", f"no API token: set ${TOKEN_ENV} or --token-file (or pass --insecure-no-auth deliberately)")
    url = storage or os.environ.get("DSTUNE_STORAGE") or default_url()
    application = create_app(
        url,
        token,
        insecure_no_auth=insecure_no_auth,
        max_body_bytes=max_body_bytes,
        recommend_cache_s=recommend_cache,
        freeze_gc=True,
    )
    if workers == 1:
        uvicorn.run(application, host=host, port=port, log_level=log_level)
        return
    application.state.store.close()  # migrated; each worker process opens its own
    os.environ.update(
        {
            "DSTUNE_STORAGE": url,
            "DSTUNE_API_TOKEN": token or "",
            "DSTUNE_INSECURE_NO_AUTH": "1" if insecure_no_auth else "0",
            "DSTUNE_MAX_BODY_BYTES": str(max_body_bytes),
            "DSTUNE_RECOMMEND_CACHE_S": str(recommend_cache),
        }
    )
    uvicorn.run(
        "tuner.api.app:create_app_from_env", factory=True, host=host, port=port, log_level=log_level, workers=workers
    )
