"""The ``gradwatch`` command: ``serve``, ``demo``, ``report``, ``upload``.

Each subcommand imports what it needs only when it runs, so ``gradwatch upload``
works on a training box that has the base install (no fastapi), and ``--help``
answers everywhere.

Example:
    $ gradwatch serve --host 127.0.0.1 --port 8765 --db gradwatch.db
    $ gradwatch upload run.jsonl --server ws://127.0.0.1:8765
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
from collections.abc import Callable, Sequence
from typing import Any

from .hints import tunnel_hint

Handler = Callable[[argparse.Namespace], int]


def _not_built(what: str, issue: str) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        print(
            f"gradwatch {what}: not built yet ({issue}); nothing was done.",
            file=sys.stderr,
        )
        return 2

    return handler


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


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


def _serve(args: argparse.Namespace) -> int:
    """``gradwatch serve``: refuses a non-loopback bind without a token (exit 2)."""
    from gradwatch.server.settings import Settings, is_loopback, user_data_dir

    try:
        # flags win over GRADWATCH_* variables; a flag not given (None) leaves them be
        settings = Settings.from_env(
            host=args.host,
            port=args.port,
            db=args.db,
            token=args.token,
            view_token=args.view_token,
            allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
            writer_process=False if args.writer == "thread" else None,
            alert_webhooks=tuple(args.alert_webhook) if args.alert_webhook else None,
            alert_min_severity=args.alert_min_severity,
            public_url=args.public_url,
            frame_ancestors=tuple(args.frame_ancestor) if args.frame_ancestor else None,
        )
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
        app = "gradwatch.server.cli:worker_app"
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


# Where earlier versions kept their databases: `serve` in the folder it started in,
# `demo` in .gradwatch/ there. Found beside a command, they are named in its messages.
FORMER_DBS = ("gradwatch.db", ".gradwatch/demo.db")


def default_db_help() -> str:
    """How the help texts name the one default database."""
    from .settings import user_data_dir

    return f"$GRADWATCH_DB, else {user_data_dir() / 'gradwatch.db'}"


def former_databases(db: str) -> str:
    """A hint naming the databases an earlier version left in this folder, or ''."""
    here = [p for p in FORMER_DBS
            if os.path.isfile(p) and os.path.abspath(p) != os.path.abspath(db)]
    if not here:
        return ""
    return " (this folder holds " + " and ".join(here) + ", where earlier versions wrote:" \
        + " --db " + here[0] + " reads it)"


def _report(args: argparse.Namespace) -> int:
    """``gradwatch report RUN -o run.html``: a standalone HTML file (server/report.py).

    Without ``--db`` it reads the one default database (:func:`default_db`), the one
    ``gradwatch serve`` and ``gradwatch demo`` write by default."""
    from .report import ReportError, write_report
    from .settings import default_db

    given = args.db is not None
    db = args.db if given else default_db()
    try:
        path = write_report(db, args.run, args.output, rank=args.rank)
    except ReportError as error:
        where = "" if given else (
            f"; looked in {db}, the default database of gradwatch serve and gradwatch demo"
            f" ({default_db_help()})"
        )
        print(f"gradwatch report: {error}{where}; name another database with --db PATH (or"
              f" a postgresql:// URL){former_databases(db)}", file=sys.stderr)
        return 2
    print(f"gradwatch report: wrote {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")
    return 0


def _upload(args: argparse.Namespace) -> int:
    """Exit 0: all acknowledged; 1: some batches refused for good (set aside);
    2: the file is missing or not a spool; 3: server unreachable or refused us (run it
    again); 4: lines of the file skipped (unreadable or torn; each named); 5: batches
    of another run than their hello's (skipped; running again cannot help)."""
    from gradwatch.protocol.spool import SpoolError
    from gradwatch.protocol.upload import UploadError, upload

    try:
        result = upload(args.spool, args.server, args.token, timeout=args.timeout)
    except (OSError, SpoolError, ValueError) as e:
        print(f"gradwatch upload: {e}", file=sys.stderr)
        return 2
    except UploadError as e:
        print(f"gradwatch upload: {e}", file=sys.stderr)
        return 3
    print(
        f"gradwatch upload: {result.acked} of {result.batches} batches "
        f"({result.records} records, {result.parts} part(s)) acknowledged by {args.server}"
    )
    for line in result.skipped_lines:
        print(f"gradwatch upload: skipped {line}", file=sys.stderr)
    if result.rejected:
        for seq, code, message in result.rejected:
            print(f"gradwatch upload: batch seq {seq} refused (code {code}): {message}",
                  file=sys.stderr)
        print(f"gradwatch upload: refused batches are in {result.rejected_file}", file=sys.stderr)
        return 1
    if result.foreign_lines:
        return 5
    if result.skipped_lines:
        print(f"gradwatch upload: {len(result.skipped_lines)} line(s) skipped; every intact "
              "batch was sent", file=sys.stderr)
        return 4
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradwatch",
        description="Live gradient-flow monitor for PyTorch training.",
    )
    from .api import version

    parser.add_argument("--version", action="version", version=f"gradwatch {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the server and dashboard")
    # Defaults live in Settings; None here lets GRADWATCH_* variables apply.
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765)")
    serve.add_argument(
        "--db",
        default=None,
        help=f"SQLite file path or postgresql:// URL (default {default_db_help()})",
    )
    serve.add_argument("--token", default=None,
                       help="ingest token (required off loopback; default none)")
    serve.add_argument("--view-token", default=None,
                       help="read-only token for viewers (default none)")
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a Host name browsers may use besides loopback and the bind address"
        " (repeatable; default none)",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes on one port (PostgreSQL only: they share its database and"
        " live feed); parses and stores in parallel (default 1)",
    )
    serve.add_argument(
        "--writer",
        choices=("process", "thread"),
        default="process",
        help="SQLite: write in a child process, so validating and writing each have a CPU"
        " (default), or on a thread of the server process",
    )
    serve.add_argument(
        "--alert-webhook",
        action="append",
        default=None,
        metavar="URL",
        help="POST each problem when raised and when cleared to this URL; Slack and Discord"
        " webhooks get their own body (repeatable; default $GRADWATCH_ALERT_WEBHOOK, none)",
    )
    serve.add_argument(
        "--alert-min-severity",
        choices=("info", "warning", "error"),
        default=None,
        help="the least severity sent to webhooks (default warning)",
    )
    serve.add_argument(
        "--public-url",
        default=None,
        metavar="URL",
        help="the dashboard's address as people reach it, for links in alerts"
        " (default http://HOST:PORT/)",
    )
    serve.add_argument(
        "--frame-ancestor",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="a site whose pages may show the dashboard in a frame, e.g. a JupyterHub at"
        " https://hub.lab.example; 'none' lets no page (repeatable; default"
        " $GRADWATCH_FRAME_ANCESTORS, else pages on this machine: http://localhost:*,"
        " http://127.0.0.1:*, http://[::1]:*)",
    )
    serve.set_defaults(handler=_serve)

    demo = sub.add_parser("demo", help="the dashboard with live example runs")
    demo.add_argument("--port", type=int, default=8765,
                      help="the dashboard's port on 127.0.0.1 (default 8765)")
    demo.add_argument("--db", default=None,
                      help="the SQLite file the demo's server writes; each round archives"
                      f" the examples' runs before it (default {default_db_help()})")
    demo.add_argument("--replay", action="store_true",
                      help="serve the runs the last demo recorded, no training (default off)")
    demo.add_argument(
        "--steps", type=int, default=None, help="training steps per example (default: per example)"
    )
    demo.add_argument(
        "--only", action="append", metavar="EXAMPLE",
        help="run only this example (repeatable; default all four)",
    )
    demo.set_defaults(handler=_run_demo)

    report = sub.add_parser("report", help="write a standalone HTML report of one run")
    report.add_argument("run", help="run id or name")
    report.add_argument("-o", "--output", default="run.html",
                        help="the HTML file to write (default run.html)")
    report.add_argument(
        "--db", default=None,
        help="SQLite path or postgresql:// URL (default the database serve and demo write:"
        f" {default_db_help()})",
    )
    report.add_argument("--rank", type=int, default=0, help="which rank's charts (default 0)")
    report.set_defaults(handler=_report)

    upload = sub.add_parser("upload", help="send a spool file to a server (idempotent)")
    upload.add_argument("spool", help="JSON Lines spool written by watch(..., server=None)")
    upload.add_argument("--server", default="ws://127.0.0.1:8765",
                        help="the server to send to (default ws://127.0.0.1:8765)")
    upload.add_argument("--token", default=None,
                        help="the server's ingest token (default none)")
    upload.add_argument(
        "--timeout", type=float, default=30.0,
        help="seconds to wait for an unreachable or silent server (default 30)",
    )
    upload.set_defaults(handler=_upload)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
