"""Whether a Ray cluster's address answers before ``ray.init`` is asked to join it (:func:`check_reachable`).

``ray.init(address="HOST:PORT")`` retries a GCS that does not answer: a refused port (a mistyped ``--ray-address``)
kept a command waiting past 200 s with no line. A plain TCP connection to the GCS port tells within seconds, and the
command then ends in one line naming the address (an environment failure, exit 1; 503 in the API)."""

from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 10.0


def gcs_endpoint(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` a ``HOST:PORT`` address names; None for what Ray resolves itself (``auto``, ``local``,
    ``ray://`` clients, a bare host)."""
    if "://" in address or address in ("auto", "local"):
        return None
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ConnectionError` (no errno: the client's own, as Ray's) when the GCS at ``address`` refuses or
    does not answer a TCP connection within ``timeout_s`` seconds."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout_s):
            return
    except OSError as error:
        reason = f"no answer within {timeout_s:g} s" if isinstance(error, TimeoutError) else error.strerror or error
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}: {reason}") from None
