"""A body over the server's limit answered as every other error: JSON ``{"detail": ...}`` with 413, as the OpenAPI
schema documents it. Starlette's body limit (:class:`~starlette.middleware.body_limit.RequestBodyLimitMiddleware`)
answers in plain text; this outer layer rewrites that answer."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DETAIL = "The body is larger than the server takes (dstune serve --max-body-bytes)."


class JsonTooLarge:
    """Pure ASGI middleware: a 413 response leaves as JSON with :data:`DETAIL`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replaced = False

        async def send_json(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 413:
                replaced = True
                body = json.dumps({"detail": DETAIL}).encode()
                headers: list[Any] = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in (b"content-type", b"content-length")
                ]
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({**message, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            elif not (replaced and message["type"] == "http.response.body"):
                await send(message)

        await self.app(scope, receive, send_json)
