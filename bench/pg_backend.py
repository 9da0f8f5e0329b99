"""Where a PostgreSQL store's time goes per step record, and what this machine's kernel
charges for writing new file pages.

The store runs in this process (no server, no trainers): batches of 100 step records
in bench/ingest.py's shape (2 x 128 timesteps, 20 parameter norms, in columns), all
submitted at once (or ``--group`` at a time) and committed in groups as the server
does. Per record: the store's writer thread CPU, its PostgreSQL backend's user and
kernel CPU and minor page faults (Linux /proc, so the database must run on this
machine). Beside it, the cost of an 8 KB ``pwrite`` that extends a file (a new page)
and of one that overwrites a page: storing step records writes new pages (table,
TOAST, WAL), and where the first costs far more than the second, the kernel, not
gradwatch or PostgreSQL, sets the pace.

    .venv/bin/python bench/pg_backend.py --postgres postgresql://postgres@127.0.0.1:54330/gw_bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ingest  # bench/ingest.py: the records' shape
import ingest_ab  # bench/ingest_ab.py: a fresh schema, the database's backends

PAGE = 8192


def page_write_us(folder: str, pages: int = 4096) -> tuple[float, float]:
    """Wall microseconds of one 8 KB pwrite that extends a file, and of one that
    overwrites a page already written (medians of 3 passes)."""
    block = os.urandom(PAGE)
    new, again = [], []
    for _ in range(3):
        fd, path = tempfile.mkstemp(dir=folder)
        try:
            for out in (new, again):
                began = time.perf_counter()
                for i in range(pages):
                    os.pwrite(fd, block, i * PAGE)
                out.append((time.perf_counter() - began) / pages * 1e6)
        finally:
            os.close(fd)
            os.unlink(path)
    return statistics.median(new), statistics.median(again)


def proc_stat(pid: int) -> tuple[int, float, float]:
    """Minor faults, user and kernel CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), int(fields[11]) / tick, int(fields[12]) / tick


def one_round(url: str, batches: int, group: int) -> dict[str, float]:
    from gradwatch.server.schema import parse_message
    from gradwatch.server.settings import Settings
    from gradwatch.server.store import open_store

    shape = argparse.Namespace(timesteps=128, params=20, batch=100)
    run_id = str(uuid.uuid4())
    texts = ingest.encode_batches(run_id, batches, 100, shape, "columns")
    parsed = [parse_message(t) for t in texts]
    hello = parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run_id}))
    store = open_store(Settings(db=url))
    try:
        store.submit_hello(hello).result()
        (backend,) = ingest_ab.backends(url)  # the writer's (no reader connected yet)
        clock = time.pthread_getcpuclockid(store.writer_thread.ident or 0)
        faults0, user0, kernel0 = proc_stat(backend)
        writer0, began = time.clock_gettime(clock), time.perf_counter()
        # ``group`` batches at a time, each time waited for: the writer commits at most
        # that many together (the server's groups are as large as what waits)
        for at in range(0, len(parsed), group):
            for future in [store.submit_batch(b) for b in parsed[at : at + group]]:
                future.result()
        wall = time.perf_counter() - began
        faults1, user1, kernel1 = proc_stat(backend)
        writer1 = time.clock_gettime(clock)
    finally:
        store.close()
    n = batches * 100
    return {
        "rec/s": n / wall,
        "writer thread": (writer1 - writer0) / n * 1e6,
        "backend user": (user1 - user0) / n * 1e6,
        "backend kernel": (kernel1 - kernel0) / n * 1e6,
        "minor faults": (faults1 - faults0) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", required=True, help="a database on this machine")
    parser.add_argument("--batches", type=int, default=300, help="batches of 100 a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--group", type=int, default=1 << 30,
                        help="batches submitted at once (default: all of a round)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to time pwrite")
    args = parser.parse_args()
    new, again = page_write_us(args.dir)
    print(f"8 KB pwrite in {args.dir}: new page {new:.1f} µs, overwrite {again:.1f} µs")
    rows = []
    try:
        for _ in range(args.rounds):
            rows.append(one_round(ingest_ab._fresh_schema(args.postgres), args.batches, args.group))
    finally:
        ingest_ab._drop_schemas()
    print(f"{args.rounds} rounds of {args.batches * 100:,} records, {min(args.group, args.batches)}"
          f" batches at a time; load average"
          f" {os.getloadavg()[0]:.1f}; µs per record (faults: per record)")
    print("| round | " + " | ".join(rows[0]) + " |")
    print("| --- " * (len(rows[0]) + 1) + "|")
    for i, row in enumerate([*rows, {k: statistics.median(r[k] for r in rows) for k in rows[0]}]):
        label = "median" if i == len(rows) else str(i + 1)
        print(f"| {label} | " + " | ".join(f"{v:,.1f}" for v in row.values()) + " |")


if __name__ == "__main__":
    main()
