"""Tokens, Host and Origin checks, and the headers every page carries.

- Tokens: ``Settings.token`` writes and reads; ``Settings.view_token`` only reads.
  With neither set, everything is open (the server binds loopback by default, and
  ``gradwatch serve`` refuses another bind without a token). A token travels as
  ``Authorization: Bearer <token>`` or ``?token=`` (scripts, the shareable link);
  comparison is constant-time. A dashboard opened with ``?token=`` gets the token
  back as an ``HttpOnly; SameSite=Strict`` cookie (:func:`token_cookie`), and its
  websockets (on which browsers cannot set headers) offer it as a subprotocol
  (:func:`protocol_token`: the cookie is not set in a frame on another site); both
  read, never write (:func:`read_token_from`).
- ``Host`` must be a loopback name, the bind address or an allowed host, so a page
  on ``evil.example`` that rebinds its DNS to 127.0.0.1 cannot reach the server
  (HTTP answers 421).
- A websocket ``Origin``, when a browser sends one, must name the same host and port
  as ``Host``: another site's page cannot open a socket with the user's network
  position.
- Frames: only pages on this machine (a Jupyter on any loopback port) and the origins
  named with ``--frame-ancestor`` may show the dashboard in a frame (CSP
  ``frame-ancestors``; :func:`security_headers`).

Example:
    >>> s = Settings(token="w", view_token="r")
    >>> can_read(s, "r"), can_write(s, "r"), can_write(s, "w")
    (True, False, True)
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .settings import LOOPBACK_FRAME_ANCESTORS, Settings

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'self'"
)  # then frame-ancestors, from the settings (security_headers)


def frame_ancestors(settings: Settings) -> str:
    """The CSP ``frame-ancestors`` sources: the dashboard itself, pages on this machine
    (a Jupyter on any loopback port shows a run in an iframe) and the origins the user
    named (``--frame-ancestor``); ``'none'`` when they named ``none``.

    >>> frame_ancestors(Settings(frame_ancestors=("https://hub.lab.example",)))
    "'self' http://localhost:* http://127.0.0.1:* https://hub.lab.example"
    >>> frame_ancestors(Settings(frame_ancestors=("none",)))
    "'none'"
    """
    if "none" in settings.frame_ancestors:
        return "'none'"
    return " ".join(("'self'", *LOOPBACK_FRAME_ANCESTORS, *settings.frame_ancestors))


def security_headers(settings: Settings) -> tuple[tuple[bytes, bytes], ...]:
    """The headers every HTTP answer carries. ``X-Frame-Options: DENY`` only when no
    page may frame the dashboard: it cannot name origins, and where it is sent a
    browser that reads it would refuse the frames CSP allows."""
    ancestors = frame_ancestors(settings)
    csp = f"{CONTENT_SECURITY_POLICY}; frame-ancestors {ancestors}"
    deny = ((b"x-frame-options", b"DENY"),) if ancestors == "'none'" else ()
    return (
        (b"content-security-policy", csp.encode()),
        (b"x-content-type-options", b"nosniff"),
        # Tokens ride in URLs (?token=): never leak them to another site.
        (b"referrer-policy", b"no-referrer"),
        *deny,
        (b"cross-origin-opener-policy", b"same-origin"),
    )


def _same(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return secrets.compare_digest(given.encode(), expected.encode())


def can_write(settings: Settings, token: str | None) -> bool:
    """Whether ``token`` may send records (``/ws/ingest``)."""
    if settings.token is None:
        return True
    return _same(token, settings.token)


def can_read(settings: Settings, token: str | None) -> bool:
    """Whether ``token`` may view (dashboard, REST, ``/ws/live``)."""
    if settings.token is None and settings.view_token is None:
        return True
    return _same(token, settings.view_token) or _same(token, settings.token)


def token_from(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The token of a request: ``Authorization: Bearer`` first, then ``?token=``."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return query.get("token")


def token_cookie(host: str | None) -> str:
    """The dashboard's token cookie for this ``Host``: one name per port, because
    browsers share cookies between the ports of one host.

    >>> token_cookie("127.0.0.1:8765"), token_cookie("gradwatch.example.org")
    ('gradwatch_token_8765', 'gradwatch_token')
    """
    _, port = split_host(host or "")
    return f"gradwatch_token_{port}" if port.isdigit() else "gradwatch_token"


def cookie_secure(scheme: str, forwarded_proto: str | None, public_url: str | None) -> bool:
    """Whether the token cookie is ``Secure``: where the browser came over https. Behind
    a TLS proxy the server itself speaks http (uvicorn trusts no proxy header), so the
    proxy's ``X-Forwarded-Proto`` or an https ``--public-url`` tells. Trusting the
    header here is safe: a forged one only makes the cookie stricter. A LAN's plain
    http keeps a cookie the browser will store (a ``Secure`` one it would drop).

    >>> cookie_secure("http", "https", None), cookie_secure("http", None, "https://gw.example")
    (True, True)
    >>> cookie_secure("http", None, None), cookie_secure("https", None, None)
    (False, True)
    """
    return "https" in (scheme, forwarded_proto) or (public_url or "").startswith("https://")


# The dashboard's websockets offer these subprotocols when the page holds a token:
# "gradwatch", which the server chooses, and the token itself (base64url), a header a
# page can set on a websocket. The cookie alone fails in a frame on another site
# (Jupyter on localhost, dashboard on 127.0.0.1): a SameSite cookie is not set there.
WS_PROTOCOL = "gradwatch"
WS_TOKEN_PROTOCOL = "gradwatch.token."  # noqa: S105 (a prefix, not a secret)


def ws_protocols(headers: Mapping[str, str]) -> list[str]:
    """The subprotocols a websocket offers (``Sec-WebSocket-Protocol``)."""
    offered = headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in offered.split(",") if p.strip()]


def ws_subprotocol(headers: Mapping[str, str]) -> str | None:
    """The subprotocol to accept a websocket with: ``gradwatch`` when it was offered
    (a browser drops a socket that offered some and got none back)."""
    return WS_PROTOCOL if WS_PROTOCOL in ws_protocols(headers) else None


def protocol_token(headers: Mapping[str, str]) -> str | None:
    """The token a dashboard websocket offered as ``gradwatch.token.<base64url>``.

    >>> protocol_token({"sec-websocket-protocol": "gradwatch, gradwatch.token.dmlldy1vbmx5"})
    'view-only'
    """
    for offered in ws_protocols(headers):
        if offered.startswith(WS_TOKEN_PROTOCOL):
            encoded = offered[len(WS_TOKEN_PROTOCOL):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (ValueError, UnicodeDecodeError):
                return None
    return None


def read_token_from(
    headers: Mapping[str, str], query: Mapping[str, str], cookies: Mapping[str, str]
) -> str | None:
    """The token of a request that only reads: as :func:`token_from`, then the token a
    dashboard websocket offered as a subprotocol (:func:`protocol_token`), then the
    dashboard's cookie (:func:`token_cookie`). Never for writes: a cookie rides along
    by itself, a header or a query is sent on purpose."""
    return (token_from(headers, query) or protocol_token(headers)
            or cookies.get(token_cookie(headers.get("host"))))


def split_host(host: str) -> tuple[str, str]:
    """``"[::1]:8765"`` -> ``("::1", "8765")``; ``"localhost"`` -> ``("localhost", "")``."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return name, port


def host_problem(settings: Settings, host: str | None) -> str | None:
    """Why this ``Host`` header may not reach the server, or None."""
    if not host:
        return "expected a Host header, got none"
    name, _ = split_host(host)
    if settings.host_allowed(name):
        return None
    return (
        f"Host {name[:60]!r} is not allowed (DNS rebinding guard); "
        f"start the server with --allowed-host {name[:60]}"
    )


def origin_problem(host: str | None, origin: str | None) -> str | None:
    """Why a websocket from page ``origin`` may not connect, or None.

    Non-browser clients send no Origin and pass; a browser page must come from the
    server's own origin (same host and port as ``Host``).
    """
    if origin is None:
        return None
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"Origin: expected the server's own http(s) origin, got {origin[:60]!r}"
    if host is None or parts.netloc.lower() != host.lower():
        return f"Origin: expected http://{(host or '')[:40]}, got {origin[:60]!r}"
    return None


class SecurityMiddleware:
    """Adds the security headers to every HTTP answer and refuses foreign ``Host``s.

    Websockets are checked in their endpoints, which can then say why in an ``error``
    message before closing with 1008.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.headers = security_headers(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        problem = host_problem(self.settings, headers.get("host"))
        if problem is not None:
            body = json.dumps({"detail": problem}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 421,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *self.headers,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)
