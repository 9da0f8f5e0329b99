"""Ingest before/after in one run: an older gradwatch server beside the current one.

Same rounds as bench/ingest.py (raw-protocol trainers, batches of 100 step records of
2 x 128 timesteps and 20 parameter norms, acked after commit), alternating between a
`gradwatch serve` of an older tree and of this one, so both see the same box.
Make the older tree's import root with::

    git worktree add /tmp/oldtree <commit>
    mkdir -p /tmp/oldgw/gradwatch
    for p in protocol server trainer_hooks client; do
        ln -s /tmp/oldtree/$p /tmp/oldgw/gradwatch/$p; done

    .venv/bin/python bench/ingest_ab.py --old /tmp/oldgw --repeat 3
    .venv/bin/python bench/ingest_ab.py --old /tmp/oldgw --postgres URL --window 64 --cpu
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ingest  # bench/ingest.py, beside this file
import serve  # bench/serve.py

_SCHEMAS: list[tuple[str, str]] = []


def _drop_schemas() -> None:
    import psycopg

    for url, schema in _SCHEMAS:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _fresh_schema(url: str) -> str:
    """``url`` with a new, empty schema of its own (old and new tables never mix)."""
    import uuid

    import psycopg

    schema = "ab_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _SCHEMAS.append((url, schema))
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def mark_cpu(marks: list[tuple[float, ...]], server: list[int], pg: list[int]) -> None:
    marks.append((cpu_s(server), cpu_s(pg), time.process_time()))


def backends(url: str) -> list[int]:
    """The PostgreSQL backends connected to this database (the server's writer, readers)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        return [int(r[0]) for r in conn.execute(query + " AND pid <> pg_backend_pid()")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="import root holding the older gradwatch/")
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--records", type=int, default=8_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default=None, help="PostgreSQL URL instead of SQLite")
    parser.add_argument("--window", type=int, default=8, help="batches in flight per trainer")
    parser.add_argument(
        "--old-encoding",
        choices=["packed", "columns"],
        default="columns",
        help="what the older server is sent (columns from 2c3a422 on)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also CPU microseconds per record of the server process, its PostgreSQL"
        " backends (Linux, with --postgres) and the trainers (this process)",
    )
    args = parser.parse_args()
    args.batch, args.timesteps, args.params = 100, 128, 20
    args.window_bytes = ingest.WINDOW_BYTES
    # (label, server env, encoding of the records)
    variants = [
        (f"old, {args.old_encoding}", {"PYTHONPATH": args.old}, args.old_encoding),
        ("new, columns, writer thread", {"GRADWATCH_WRITER": "thread"}, "columns"),
        ("new, columns", {}, "columns"),
    ]
    if args.postgres:  # PostgreSQL's writer is always a thread: no third variant
        del variants[1]
    rates: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    print(f"load average at start: {os.getloadavg()[0]:.2f}; window {args.window} batches")
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.repeat):
            for label, env, encoding in variants:
                db = _fresh_schema(args.postgres) if args.postgres else str(
                    Path(folder) / f"{label[:3]}-{r}.db"
                )
                server = serve.Server(db, env)
                url = server.http.replace("http://", "ws://")
                try:
                    for n in args.trainers:
                        pg = backends(args.postgres) if args.postgres and args.cpu else []
                        marks: list[tuple[float, ...]] = []
                        mark = partial(mark_cpu, marks, [server.process.pid], pg)
                        rate = asyncio.run(
                            ingest.one_round(url, n, args.records, args, encoding, mark)
                        )
                        mark()
                        rates.setdefault((label, n), []).append(rate)
                        sent = (args.records // n // args.batch) * n * args.batch / 1e6
                        used = tuple((b - a) / sent for a, b in zip(*marks, strict=True))
                        cpu.setdefault((label, n), []).append(used)
                finally:
                    server.stop()
    _drop_schemas()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    backend = "postgresql" if args.postgres else "sqlite"
    print(f"| {backend} | " + " | ".join(f"{n} trainers (rec/s)" for n in args.trainers) + " |")
    print("| --- |" + " --- |" * len(args.trainers))
    base = {n: statistics.median(rates[variants[0][0], n]) for n in args.trainers}
    for label, _, _ in variants:
        cells = []
        for n in args.trainers:
            m = statistics.median(rates[label, n])
            cells.append(f"{m:,.0f} ({m / base[n]:.2f}x)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.cpu:
        print("CPU us per record (medians): server process / its PostgreSQL backends / trainers")
        for label, _, _ in variants:
            cells = [
                " / ".join(
                    f"{statistics.median(u[k] for u in cpu[label, n]):.1f}" for k in range(3)
                )
                for n in args.trainers
            ]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
