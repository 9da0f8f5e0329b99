"""The store's writer alone, before/after: CPU microseconds of its writer thread a record.

Each round runs a store in a process of its own (no server, no trainers, no writer
process): batches of 100 step records in bench/ingest.py's shape (2 x 128 timesteps,
20 parameter norms, in columns), all submitted at once and committed in groups as the
server does; the writer thread's CPU time (its own clock, so other processes on the box
cost it little) and records/s. With ``--old ROOT`` (an import root of an older tree, as
bench/ingest_ab.py makes) old and new alternate, and each round's new/old ratio is kept.

    .venv/bin/python bench/store_writes_ab.py --old /tmp/oldgw --rounds 8
    .venv/bin/python bench/store_writes_ab.py --old /tmp/oldgw --postgres URL --rounds 6
    .venv/bin/python bench/store_writes_ab.py --old /tmp/oldgw --postgres URL --runs 16 --group 16

``--runs N`` spreads a round's batches over N runs sent side by side (as N trainers);
``--group K`` submits K batches at a time, so no commit holds more than K. With
PostgreSQL, the writer's backend's user and kernel CPU a record are printed too.
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
import argparse, json, os, sys, tempfile, time, uuid
BENCH, BATCHES, URL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
RUNS, GROUP = int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, BENCH)
import ingest, ingest_ab
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

shape = argparse.Namespace(timesteps=128, params=20, batch=100)
run_ids = [str(uuid.uuid4()) for _ in range(RUNS)]
texts = [ingest.encode_batches(r, BATCHES // RUNS, 100, shape, "columns") for r in run_ids]
per_run = [[parse_message(t) for t in run] for run in texts]
# in the order RUNS trainers sending side by side would bring them
parsed = [batches[i] for i in range(BATCHES // RUNS) for batches in per_run]
hellos = [parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": r})) for r in run_ids]
if URL:
    settings = Settings(db=ingest_ab._fresh_schema(URL))
else:
    settings = Settings(db=tempfile.mkdtemp(prefix="gw-writes-") + "/w.db", writer_process=False)
store = open_store(settings)
def backend_cpu():  # user and kernel seconds of the writer's PostgreSQL backend
    if not URL:
        return 0.0, 0.0
    fields = open(f"/proc/{backend}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick
try:
    for hello in hellos:
        store.submit_hello(hello).result()
    if URL:
        (backend,) = ingest_ab.backends(settings.db)  # the writer's: no reader yet
    clock = time.pthread_getcpuclockid(store.writer_thread.ident or 0)
    cpu, began, pg = time.clock_gettime(clock), time.perf_counter(), backend_cpu()
    for at in range(0, len(parsed), GROUP):  # at most GROUP batches waiting: commit sizes
        for future in [store.submit_batch(b) for b in parsed[at : at + GROUP]]:
            future.result()
    wall = time.perf_counter() - began
    cpu = time.clock_gettime(clock) - cpu
    user, kernel = (b - a for a, b in zip(pg, backend_cpu()))
finally:
    store.close()
    ingest_ab._drop_schemas()
n = len(parsed) * 100
print(json.dumps({"writer_us": cpu / n * 1e6, "rec_s": n / wall,
                  "pg_user_us": user / n * 1e6, "pg_kernel_us": kernel / n * 1e6}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=None, help="import root of an older tree")
    parser.add_argument("--postgres", default="", help="PostgreSQL URL instead of SQLite")
    parser.add_argument("--batches", type=int, default=200, help="batches of 100 a round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=1, help="the batches spread over N runs")
    parser.add_argument(
        "--group", type=int, default=1 << 30, help="batches submitted at a time (commit size)"
    )
    args = parser.parse_args()
    command = [sys.executable, "-c", ROUND, str(Path(__file__).parent), str(args.batches)]
    command += [args.postgres, str(args.runs), str(args.group)]
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
        backend = "".join(
            f", backend {what} {statistics.median(row[f'pg_{what}_us'] for row in rows):.2f} us"
            for what in ("user", "kernel")
            if args.postgres
        )
        print(
            f"{tree}: writer thread {statistics.median(cpu):.2f} us a record"
            f" ({cpu[0]:.2f}-{cpu[-1]:.2f}){backend}, {rate:,.0f} records/s (median)"
        )
    if args.old is not None:
        ratios = [n["writer_us"] / o["writer_us"] for o, n in zip(*found.values(), strict=True)]
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"new/old writer CPU by round: {shown}; median {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
