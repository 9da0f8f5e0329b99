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
import sys
from collections.abc import Callable, Sequence

from .hints import default_db_help, former_databases

Handler = Callable[[argparse.Namespace], int]


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def _serve(args: argparse.Namespace) -> int:
    from .serving import serve

    return serve(args)


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
        default=None,
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
        " http://127.0.0.1:*)",
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
        help="run only this example (repeatable; default all five)",
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
