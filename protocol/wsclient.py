"""Opening a trainer's websocket to ``/ws/ingest``: URL rules and connect options.

Shared by the live sender (:mod:`.sender`) and ``gradwatch upload``
(:mod:`.upload`), so both reach the server the same way.

Example:
    >>> ingest_url("ws://127.0.0.1:8765")
    'ws://127.0.0.1:8765/ws/ingest'
    >>> ingest_url("http://gpu-box:8765/")
    'ws://gpu-box:8765/ws/ingest'
"""

from __future__ import annotations

import contextlib
import inspect
import socket
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from websockets.sync.client import ClientConnection, connect

INGEST_PATH = "/ws/ingest"

_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}

# websockets >= 15 goes through a system HTTP proxy by default; a trainer talking to
# its own server (usually over loopback or an SSH tunnel) must not.
_HAS_PROXY_OPTION = "proxy" in inspect.signature(connect).parameters


def ingest_url(url: str) -> str:
    """``ws://host:port`` -> ``ws://host:port/ws/ingest``; an explicit path is kept."""
    if not isinstance(url, str):
        raise TypeError(f"expected a server URL such as 'ws://127.0.0.1:8765', got {url!r}")
    parts = urlsplit(url.strip())
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise ValueError(f"expected a server URL such as 'ws://127.0.0.1:8765', got {url!r}")
    path = parts.path if parts.path not in ("", "/") else INGEST_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def run_link(url: str, run_id: str, rank: int = 0) -> str:
    """The dashboard's page of a run, from the server's ``ws(s)://`` URL.

    >>> run_link("ws://127.0.0.1:8765/ws/ingest", "ab", 1)
    'http://127.0.0.1:8765/#/run/ab/1'
    """
    parts = urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}/#/run/{quote(run_id, safe='')}/{rank}"


def open_ingest(url: str, token: str | None, timeout: float) -> ClientConnection:
    """Connect to an ingest URL (already passed through :func:`ingest_url`).

    No per-message compression: deflate cut websocket throughput about 8x when
    measured here, and records are sent in batches anyway.
    """
    options: dict[str, Any] = {
        "compression": None,
        "open_timeout": timeout,
        "close_timeout": min(timeout, 2.0),
        # The server only sends small acks; the default 1 MiB bound is plenty, but an
        # error message naming a long field must not be refused.
        "max_size": 1 << 22,
    }
    if token:
        options["additional_headers"] = {"Authorization": f"Bearer {token}"}
    if _HAS_PROXY_OPTION:
        options["proxy"] = None
    connection = connect(url, **options)
    # websockets 17 wants `with connect(...)`; the connection outlives this function, so
    # enter it here (which is all the context manager does on the way in).
    entered: ClientConnection = connection.__enter__()
    return entered


def abort(ws: ClientConnection) -> None:
    """Drop a connection now, without waiting for a closing handshake a dead server
    would never answer."""
    with contextlib.suppress(Exception):
        ws.socket.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        ws.close()
