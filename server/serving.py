"""``gradwatch serve``: the checks made before anything binds, the banner, the workers.

Every refusal is one line on stderr and exit status 2, said before "serving": a port
in use, a database that cannot be written or has another layout, a bind reachable from
other machines without a token or with a short one, ``--workers`` without PostgreSQL.

Example:
    >>> from gradwatch.server.settings import Settings
    >>> serving_banner(Settings(host="127.0.0.1", port=8765)).splitlines()[0]
    'gradwatch: serving on http://127.0.0.1:8765/ (db sqlite)'
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from typing import Any

from .hints import former_databases, tunnel_hint


def port_in_use(host: str, port: int) -> str | None:
    """A one-line reason when ``host:port`` cannot be listened on, else None."""
    import errno

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is in use (another gradwatch?); stop it, or"
                        " choose another port with --port PORT")
            if e.errno == errno.EADDRNOTAVAIL:
                return f"--host {host}: no such address on this machine"
    return None


def serving_banner(settings: Any) -> str:
    """Where the dashboard is, and, on loopback, how to reach it from another machine."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{settings.port}/"
    lines = [f"gradwatch: serving on {url} (db {settings.db_kind})"]
    view = settings.view_token or settings.token
    if view:
        lines.append(f"  viewer link: {url}?token=<your view token>")
    if settings.host in ("127.0.0.1", "localhost", "::1"):
        lines.append(tunnel_hint(settings.port))
    return "\n".join(lines)


MIN_TOKEN_CHARS = 16


def database_problem(settings: Any) -> str | None:
    """Why a SQLite ``--db`` cannot be written, with its path and the cause, or None.

    Checked before anything says "serving": SQLite itself only says "unable to open
    database file", with neither.
    """
    if settings.db_kind != "sqlite" or settings.db == ":memory:":
        return None
    path = os.path.abspath(settings.db)
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):  # SQLite would create a missing file too
            pass
        if not existed:
            os.unlink(path)  # the server creates it when it starts
    except OSError as error:
        return f"--db {path}: cannot open the database for writing: {error.strerror}"
    folder = os.path.dirname(path)
    if not os.access(folder, os.W_OK):
        return f"--db {path}: its folder {folder} is not writable (SQLite keeps -wal beside it)"
    from .store.tables import layout_problem  # another storage layout: what to do

    return layout_problem(path)


def token_problem(settings: Any, loopback: bool) -> str | None:
    """Why the tokens are too weak for a server reachable from other machines."""
    if loopback:
        return None
    for flag, token in (("--token", settings.token), ("--view-token", settings.view_token)):
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            return (
                f"{flag}: expected at least {MIN_TOKEN_CHARS} characters with --host "
                f"{settings.host} (reachable from other machines), got {len(token)}; for "
                f"example {secrets.token_urlsafe(24)} (python -c \"import secrets; "
                "print(secrets.token_urlsafe(24))\"). Nothing was started."
            )
    return None


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Any:
    """``gradwatch serve``'s settings: its flags over the ``GRADWATCH_*`` variables
    (a flag not given, None, leaves its variable be). Raises ValueError.

    Example:
        >>> from gradwatch.server.cli import build_parser
        >>> args = build_parser().parse_args(["serve", "--writer", "process"])
        >>> settings_from(args, {"GRADWATCH_WRITER": "thread"}).writer_process
        True
    """
    from gradwatch.server.settings import Settings

    return Settings.from_env(
        environ,
        host=args.host,
        port=args.port,
        db=args.db,
        token=args.token,
        view_token=args.view_token,
        allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
        writer_process=None if args.writer is None else args.writer == "process",
        alert_webhooks=tuple(args.alert_webhook) if args.alert_webhook else None,
        alert_min_severity=args.alert_min_severity,
        public_url=args.public_url,
        frame_ancestors=tuple(args.frame_ancestor) if args.frame_ancestor else None,
    )


def serve(args: argparse.Namespace) -> int:
    """``gradwatch serve``: refuses a non-loopback bind without a token (exit 2)."""
    from gradwatch.server.settings import is_loopback, user_data_dir

    try:
        settings = settings_from(args)
    except ValueError as error:
        print(f"gradwatch serve: {error}", file=sys.stderr)
        return 2
    if not is_loopback(settings.host) and not settings.token:
        print(
            f"gradwatch serve: --host {settings.host} is reachable from other machines; "
            "expected --token TOKEN (and --view-token for read-only viewers), got none. "
            "Nothing was started. Bind 127.0.0.1 and use an SSH tunnel, or set tokens.",
            file=sys.stderr,
        )
        return 2
    problem = token_problem(settings, is_loopback(settings.host))
    if problem is None and settings.db == str(user_data_dir() / "gradwatch.db"):
        # the default, in the user's data folder: made at the first serve (if it cannot
        # be, database_problem says why)
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(settings.db), exist_ok=True)
        hint = former_databases(settings.db)
        if hint:
            print(f"gradwatch serve: note: the database is {settings.db}{hint}", file=sys.stderr)
    problem = problem or database_problem(settings)
    if problem is not None:
        print(f"gradwatch serve: {problem}", file=sys.stderr)
        return 2
    if settings.view_token and not settings.token:
        print(
            "gradwatch serve: warning: --view-token without --token: viewers need the view "
            "token, but any process on this machine may write (ingest is open on loopback). "
            "Add --token TOKEN to require one for trainers too.",
            file=sys.stderr,
        )
    workers = int(args.workers or 1)
    if workers < 1:
        print(f"gradwatch serve: --workers: expected 1 or more, got {workers}", file=sys.stderr)
        return 2
    if workers > 1 and settings.db_kind != "postgresql":
        print(
            f"gradwatch serve: --workers {workers} needs --db postgresql://...: live records"
            " reach viewers on other worker processes through PostgreSQL (docs/DEPLOY.md);"
            f" got --db {settings.db} ({settings.db_kind}). Nothing was started.",
            file=sys.stderr,
        )
        return 2
    problem = port_in_use(settings.host, settings.port) if settings.port else None
    if problem is not None:
        print(f"gradwatch serve: {problem}", file=sys.stderr)
        return 2
    import uvicorn

    from gradwatch.server.app import create_app
    from gradwatch.server.http_timeouts import protocol_with_timeout
    from gradwatch.server.logs import log_config

    print(serving_banner(settings), flush=True)
    app: Any
    if workers > 1:
        # Each worker process builds its own app (its own store and replica feed) from
        # the settings resolved here, handed over in the environment they inherit.
        os.environ[WORKER_SETTINGS] = json.dumps(dataclasses.asdict(settings))
        app = "gradwatch.server.serving:worker_app"
    else:
        app = create_app(settings)
    uvicorn.run(
        app,
        factory=workers > 1,
        workers=workers if workers > 1 else None,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        ws="websockets-sansio",
        # Larger than the protocol's limit, so an oversized message reaches the server
        # and gets an error message with close code 1009 instead of a bare close.
        ws_max_size=2 * settings.max_message_bytes,
        ws_per_message_deflate=False,
        # h11 with a deadline on request headers (server/http_timeouts.py), and a cap
        # on connections: half-sent requests cannot exhaust file descriptors.
        http=protocol_with_timeout(settings.header_timeout_s),
        limit_concurrency=settings.max_connections,
        proxy_headers=False,
        server_header=False,
        log_config=log_config(),  # tokens in logged paths are redacted (server/logs.py)
    )
    return 0


WORKER_SETTINGS = "GRADWATCH_WORKER_SETTINGS"


def worker_app() -> Any:
    """The app of one ``--workers`` process: the settings ``gradwatch serve`` resolved."""
    from gradwatch.server.app import create_app
    from gradwatch.server.http_timeouts import protocol_with_timeout
    from gradwatch.server.settings import Settings

    values = json.loads(os.environ[WORKER_SETTINGS])
    values["allowed_hosts"] = tuple(values.get("allowed_hosts") or ())
    values["alert_webhooks"] = tuple(values.get("alert_webhooks") or ())
    values["frame_ancestors"] = tuple(values.get("frame_ancestors") or ())
    settings = Settings(**values)
    protocol_with_timeout(settings.header_timeout_s)  # this process's protocol class
    return create_app(settings)
