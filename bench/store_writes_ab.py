"""The store's writer alone, before/after: CPU microseconds of its writer thread a record.

Each round runs a store in a process of its own (no server, no trainers, no writer
process): batches of 100 step records in bench/ingest.py's shape (2 x 128 timesteps,
20 parameter norms, in columns), all submitted at once and committed in groups as the
server does; the writer thread's CPU time (its own clock, so other processes on the box
cost it little) and records/s. With ``--old ROOT`` (an import root of an older tree, as
bench/ingest_ab.py makes) old and new alternate, and each round's new/old ratio is kept.

    .venv/bin/python bench/store_writes_ab.py --old /tmp/oldgw --rounds 8
    .venv/bin/python bench/store_writes_ab.py --old /tmp/oldgw --postgres URL --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = r"""
import argparse, json, sys, tempfile, time, uuid
BENCH, BATCHES, URL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, BENCH)
import ingest, ingest_ab
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

shape = argparse.Namespace(timesteps=128, params=20, batch=100)
run_id = str(uuid.uuid4())
parsed = [parse_message(t) for t in ingest.encode_batches(run_id, BATCHES, 100, shape, "columns")]
hello = parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run_id}))
if URL:
    settings = Settings(db=ingest_ab._fresh_schema(URL))
else:
    settings = Settings(db=tempfile.mkdtemp(prefix="gw-writes-") + "/w.db", writer_process=False)
store = open_store(settings)
try:
    store.submit_hello(hello).result()
    clock = time.pthread_getcpuclockid(store.writer_thread.ident or 0)
    cpu, began = time.clock_gettime(clock), time.perf_counter()
    for future in [store.submit_batch(b) for b in parsed]:
        future.result()
    wall = time.perf_counter() - began
    cpu = time.clock_gettime(clock) - cpu
finally:
    store.close()
    ingest_ab._drop_schemas()
print(json.dumps({"writer_us": cpu / (BATCHES * 100) * 1e6, "rec_s": BATCHES * 100 / wall}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=None, help="import root of an older tree")
    parser.add_argument("--postgres", default="", help="PostgreSQL URL instead of SQLite")
    parser.add_argument("--batches", type=int, default=200, help="batches of 100 a round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    command = [sys.executable, "-c", ROUND, str(Path(__file__).parent), str(args.batches)]
    command.append(args.postgres)
    trees = ["new"] if args.old is None else ["old", "new"]
    found: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            env = dict(os.environ)
            if tree == "old":
                env["PYTHONPATH"] = args.old
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                print(done.stderr)
                return 1
            found[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"load average at end: {os.getloadavg()[0]:.2f}; {args.batches * 100:,} records a round")
    for tree, rows in found.items():
        cpu = sorted(row["writer_us"] for row in rows)
        rate = statistics.median(row["rec_s"] for row in rows)
        print(
            f"{tree}: writer thread {statistics.median(cpu):.2f} us a record"
            f" ({cpu[0]:.2f}-{cpu[-1]:.2f}), {rate:,.0f} records/s (median)"
        )
    if args.old is not None:
        ratios = [n["writer_us"] / o["writer_us"] for o, n in zip(*found.values(), strict=True)]
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"new/old writer CPU by round: {shown}; median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
