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


def _report(args: argparse.Namespace) -> int:
    """``gradwatch report RUN -o run.html``: a standalone HTML file (server/report.py)."""
    from .report import main as report_main

    return report_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradwatch",
        description="Live gradient-flow monitor for PyTorch training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the server and dashboard")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    serve.add_argument(
        "--db",
        default="gradwatch.db",
        help="SQLite file path or postgresql:// URL (default gradwatch.db)",
    )
    serve.add_argument("--token", default=None, help="ingest token (required off loopback)")
    serve.add_argument("--view-token", default=None, help="read-only token for viewers")
    serve.set_defaults(handler=_not_built("serve", "the server is issue #5"))

    demo = sub.add_parser("demo", help="the dashboard with live example runs")
    demo.add_argument("--port", type=int, default=8765)
    demo.add_argument("--db", default=".gradwatch/demo.db")
    demo.add_argument("--replay", action="store_true", help="show recorded runs, no training")
    demo.add_argument(
        "--steps", type=int, default=400, help="training steps per example trainer (default 400)"
    )
    demo.set_defaults(handler=_run_demo)

    report = sub.add_parser("report", help="write a standalone HTML report of one run")
    report.add_argument("run", help="run id or name")
    report.add_argument("-o", "--output", default="run.html")
    report.add_argument("--db", default="gradwatch.db", help="SQLite path or postgresql:// URL")
    report.add_argument("--rank", type=int, default=0, help="which rank's charts (default 0)")
    report.set_defaults(handler=_report)

    upload = sub.add_parser("upload", help="send a spool file to a server (idempotent)")
    upload.add_argument("spool", help="JSON Lines spool written by watch(..., server=None)")
    upload.add_argument("--server", default="ws://127.0.0.1:8765")
    upload.add_argument("--token", default=None)
    upload.set_defaults(handler=_not_built("upload", "the transport is issue #5"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
