"""Two replicas on one PostgreSQL: what live fan-out across replicas costs.

1. Latency, side by side in one run: one raw-protocol trainer sends batches to replica
   A one at a time (waiting for each ack); a viewer on A (the local fast path) and a
   viewer on B (LISTEN/NOTIFY, then one read of the stored records) time each batch
   from the send to its arrival. Medians and p90 in ms.
2. Write cost, side by side in one run, in-process: batches per second that a
   PostgresStore commits while another replica has a run's viewer (each batch's frame
   stored again in the UNLOGGED live_batches table, plus a NOTIFY), while none has
   (the NOTIFY only), and with the announce switched off; and the CPU time per record
   of the writer thread plus its PostgreSQL backend (when the server is on this
   machine: /proc), which a busy machine disturbs less than the rates.

    .venv/bin/python bench/replicas.py --postgres postgresql://postgres@127.0.0.1:54333/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import step_record
from serve import free_port


@contextmanager
def schema(url: str) -> Iterator[str]:
    import psycopg

    name = "gw_bench_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@contextmanager
def server(db: str) -> Iterator[str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gradwatch.server.cli",
        "serve",
        "--port",
        str(port),
        "--db",
        db,
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(cmd, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("server did not start") from None
                time.sleep(0.05)  # readiness poll
        yield f"ws://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def hello(run_id: str) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": 1,
        "run_id": run_id,
        "run": "bench",
        "rank": 0,
        "world_size": 1,
        "host": "bench",
        "pid": 1,
        "model": {
            "modules": [{"name": "lstm1", "type": "LSTM"}],
            "parameters": 1,
            "recurrent": ["lstm1"],
        },
        "config": {},
    }


def latency(db: str, batches: int, per_batch: int, args: argparse.Namespace) -> None:
    rng = random.Random(0)
    run_id = str(uuid.uuid4())
    arrived: dict[str, dict[int, float]] = {"A": {}, "B": {}}
    with server(db) as a, server(db) as b, ExitStack() as stack:
        viewers = {
            name: stack.enter_context(connect(f"{url}/ws/live?run={run_id}", max_size=None))
            for name, url in (("A", a), ("B", b))
        }
        for ws in viewers.values():
            json.loads(ws.recv(timeout=30))  # subscribed

        def read(name: str) -> None:
            ws = viewers[name]
            while len(arrived[name]) < batches:
                message = json.loads(ws.recv(timeout=60))
                if message["type"] == "records":
                    arrived[name][message["seq"]] = time.perf_counter()

        readers = [threading.Thread(target=read, args=(n,)) for n in viewers]
        for thread in readers:
            thread.start()
        sent: dict[int, float] = {}
        with connect(f"{a}/ws/ingest", max_size=None) as trainer:
            trainer.send(json.dumps(hello(run_id)))
            for seq in range(batches):
                records = [
                    step_record(seq * per_batch + i, rng, args.timesteps, args.params)
                    for i in range(per_batch)
                ]
                text = json.dumps(
                    {"type": "batch", "run_id": run_id, "rank": 0, "seq": seq, "records": records}
                )
                sent[seq] = time.perf_counter()
                trainer.send(text)
                json.loads(trainer.recv(timeout=60))  # ack
        for thread in readers:
            thread.join(timeout=120)
    print(f"latency, send -> viewer, {batches} batches of {per_batch} step records:")
    for name, what in (("A", "viewer on A (local)"), ("B", "viewer on B (other replica)")):
        ms = sorted(1e3 * (arrived[name][s] - sent[s]) for s in sent if s in arrived[name])
        p90 = ms[int(0.9 * (len(ms) - 1))]
        print(
            f"  {what:30s} median {statistics.median(ms):7.2f} ms   p90 {p90:7.2f} ms"
            f"   ({len(ms)}/{batches} arrived)"
        )


def write_rate(db: str, batches: int, per_batch: int, args: argparse.Namespace) -> None:
    import psycopg

    from gradwatch.server.schema import parse_message
    from gradwatch.server.settings import Settings
    from gradwatch.server.store.base import Store
    from gradwatch.server.store.postgres import WATCH, PostgresStore

    class Silent(PostgresStore):
        """The same store with the live announce switched off."""

        def _write_hello(self, cur: Any, hello: Any) -> None:
            Store._write_hello(self, cur, hello)

        def _write_batch(self, cur: Any, batch: Any, session: str) -> bool:
            return Store._write_batch(self, cur, batch, session)

    def timed(base: type[PostgresStore]) -> type[PostgresStore]:
        class Timed(base):  # type: ignore[valid-type,misc]
            cpu = 0.0  # the writer thread's CPU seconds

            def _write_group(self, conn: Any, group: list[Any]) -> None:
                began = time.thread_time()
                try:
                    super()._write_group(conn, group)
                finally:
                    self.cpu += time.thread_time() - began

        return Timed

    rng = random.Random(1)
    modes = (
        ("frames stored", timed(PostgresStore)),
        ("no viewer else", timed(PostgresStore)),
        ("no announce", timed(Silent)),
    )
    rates: dict[str, list[float]] = {name: [] for name, _ in modes}
    cpu: dict[str, list[float]] = {name: [] for name, _ in modes}
    for _ in range(args.repeat):
        for name, cls in modes:
            run_id = str(uuid.uuid4())
            parsed = [
                parse_message(
                    json.dumps(
                        {
                            "type": "batch",
                            "run_id": run_id,
                            "rank": 0,
                            "seq": seq,
                            "records": [
                                step_record(seq * per_batch + i, rng, args.timesteps, args.params)
                                for i in range(per_batch)
                            ],
                        }
                    )
                )
                for seq in range(batches)
            ]
            store = cls(Settings(db=db))
            if name == "frames stored":  # a viewer on another replica (not this store)
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute(WATCH, ("bench-other", 3600.0))
            try:
                store.submit_hello(parse_message(json.dumps(hello(run_id)))).result()
                backend = _proc_cpu(store._writer_conn.info.backend_pid)
                writer = store.cpu  # type: ignore[attr-defined]
                start = time.perf_counter()
                # As ingest does: several batches in flight, group-committed.
                futures = [store.submit_batch(batch) for batch in parsed]
                for future in futures:
                    future.result()
                rates[name].append(batches / (time.perf_counter() - start))
                backend = _proc_cpu(store._writer_conn.info.backend_pid) - backend
                used = store.cpu - writer + backend  # type: ignore[attr-defined]
                cpu[name].append(used / (batches * per_batch) * 1e6)
            finally:
                store.close()
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute("DELETE FROM live_replicas")
    base = statistics.median(rates["no announce"])
    print(f"store writes, {batches} batches of {per_batch} step records, median of {args.repeat}:")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(
            f"  {name:15s} {rate:8.1f} batches/s  {rate * per_batch:9.0f} records/s"
            f"  ratio {rate / base:.2f}   CPU {statistics.median(cpu[name]):5.1f} us/record"
        )


def _proc_cpu(pid: int) -> float:
    """CPU seconds of a local process (a PostgreSQL backend); 0 when it is elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            name, fields = stat.read().split(" (", 1)[1].rsplit(")", 1)
    except (OSError, IndexError):
        return 0.0
    if name != "postgres":
        return 0.0  # that pid is another process here: the server is elsewhere
    fields = fields.split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=10, help="step records per batch")
    parser.add_argument("--timesteps", type=int, default=128)
    parser.add_argument("--params", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with schema(args.postgres) as db:
        latency(db, args.batches, args.batch, args)
        write_rate(db, args.batches, args.batch, args)


if __name__ == "__main__":
    main()
