"""Ingest throughput: step records stored and acknowledged per second.

N concurrent raw-protocol trainers (websocket clients speaking protocol v1 directly,
no gradwatch sender) each send `hello`, then batches of step records with 2 recurrent
modules x 128 timesteps and 20 parameter norms, with as much in flight as gradwatch's
own sender keeps (`--window` batches and `--window-bytes`, its defaults: 64 and 8 MiB,
~27 batches of 100 such records in columns), and wait for every ack. An ack means
"committed", so records/s is stored AND acknowledged. 1, 4 and 16 trainers run side
by side in one run, against SQLite (and PostgreSQL with --postgres URL); medians of
--repeat rounds. Records go in columns, as gradwatch's sender sends them (--encoding
adds the JSON encodings a raw client may send). The server is a real `gradwatch serve`
process on 127.0.0.1; clients share the machine with it.

Also printed: where the server's time goes for one such record (in-process: JSON
validation, row building, SQLite insert) and how long the history API takes to
downsample a long run (--history-steps, default 1e6; 0 skips it).

    .venv/bin/python bench/ingest.py                     # SQLite
    .venv/bin/python bench/ingest.py --postgres postgresql://postgres@127.0.0.1:54329/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import statistics
import struct
import tempfile
import time
import uuid
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

from serve import Server  # bench/serve.py, beside this file
from websockets.asyncio.client import connect

from gradwatch.protocol.outbox import WINDOW_BATCHES, WINDOW_BYTES


def _packed(values: list[float]) -> dict[str, str]:
    """The packed wire form of a series: base64 of little-endian float64."""
    return {"f64": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode()}


def step_record(
    step: int, rng: random.Random, timesteps: int, params: int, packed: bool = False
) -> dict[str, Any]:
    record = {
        "kind": "step",
        "step": step,
        "epoch": step // 1000,
        "t": time.time(),
        "duration_s": 0.01 + rng.random() * 1e-3,
        "loss": rng.random(),
        "timesteps": {
            "lstm1": {"input": [rng.random() * 10.0 ** -(k % 30) for k in range(timesteps)]},
            "lstm2": {"input": [rng.random() for _ in range(timesteps)]},
        },
        "param_norms": {f"lstm{1 + j % 2}.weight_{j}": rng.random() for j in range(params)},
        "total_norm": rng.random(),
        "graph_nodes": 1000,
        "rss_bytes": 123456789,
        "overhead": 0.01,
    }
    if packed:
        record["timesteps"] = {
            module: {name: _packed(values) for name, values in series.items()}
            for module, series in record["timesteps"].items()
        }
    return record


def encode_batches(
    run_id: str, batches: int, per_batch: int, args: argparse.Namespace, encoding: str = "lists"
) -> list[str]:
    """Batch texts: records with series as lists or packed, or "columns" (the trainer's
    encoder, gradwatch.protocol.columns, as its websocket sender does by default)."""
    from gradwatch.protocol.columns import to_columns

    rng = random.Random(run_id)
    texts = []
    for seq in range(batches):
        records = [
            step_record(seq * per_batch + i, rng, args.timesteps, args.params, encoding != "lists")
            for i in range(per_batch)
        ]
        message: dict[str, Any] = {"type": "batch", "run_id": run_id, "rank": 0, "seq": seq}
        if encoding == "columns":
            message["records"], message["columns"] = to_columns(records)
        else:
            message["records"] = records
        texts.append(json.dumps(message, separators=(",", ":")))
    return texts


async def trainer(
    url: str, run_id: str, texts: list[str], args: argparse.Namespace, start: asyncio.Event
) -> None:
    hello = {
        "type": "hello",
        "protocol": 1,
        "run_id": run_id,
        "run": "bench",
        "rank": 0,
        "world_size": 1,
        "host": "bench",
        "pid": os.getpid(),
        "model": {"modules": [], "recurrent": ["lstm1", "lstm2"]},
        "config": {},
    }
    async with connect(url + "/ws/ingest", compression=None, max_size=None) as ws:
        await ws.send(json.dumps(hello))
        await start.wait()
        # In flight as the sender's outbox allows: at most `window` batches and
        # `window_bytes` (but always one), acked in order.
        sizes: deque[int] = deque()
        room = asyncio.Condition()

        def fits(size: int) -> bool:
            return not sizes or (
                len(sizes) < args.window and sum(sizes) + size <= args.window_bytes
            )

        async def sender() -> None:
            for text in texts:
                async with room:
                    await room.wait_for(partial(fits, len(text)))
                    sizes.append(len(text))
                await ws.send(text)

        task = asyncio.create_task(sender())
        for expected in range(len(texts)):
            ack = json.loads(await ws.recv())
            if ack != {"type": "ack", "seq": expected}:
                raise SystemExit(f"expected ack {expected}, got {ack}")
            async with room:
                sizes.popleft()
                room.notify_all()
        await task


async def one_round(
    url: str,
    trainers: int,
    records: int,
    args: argparse.Namespace,
    encoding: str,
    on_start: Any = None,
) -> float:
    """Records/s of one round; ``on_start()`` is called as the clock starts."""
    per_trainer = records // trainers
    batches = max(1, per_trainer // args.batch)
    payloads = [
        encode_batches(str(uuid.uuid4()), batches, args.batch, args, encoding)
        for _ in range(trainers)
    ]
    start = asyncio.Event()
    tasks = [
        asyncio.create_task(trainer(url, str(json.loads(p[0])["run_id"]), p, args, start))
        for p in payloads
    ]
    await asyncio.sleep(0.2)  # let every hello land before the clock starts
    if on_start is not None:
        on_start()
    began = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    return trainers * batches * args.batch / (time.perf_counter() - began)


def breakdown(args: argparse.Namespace, encoding: str) -> dict[str, float]:
    """Microseconds per record of each server-side stage, in this process."""
    from gradwatch.server.schema import parse_message
    from gradwatch.server.settings import Settings
    from gradwatch.server.store import open_store
    from gradwatch.server.store.split import split_batch

    run_id = str(uuid.uuid4())
    texts = encode_batches(run_id, 10, args.batch, args, encoding)
    n = 10 * args.batch
    t0 = time.perf_counter()
    parsed = [parse_message(t) for t in texts]
    t1 = time.perf_counter()
    for b in parsed:
        split_batch(b, lambda v: v)
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        # The writer on a thread of this process: its CPU per record, not a round trip.
        store = open_store(Settings(db=str(Path(folder) / "b.db"), writer_process=False))
        hello = parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": run_id}))
        store.submit_hello(hello).result()
        # The writer's own rollup step (store/chunk_writes.py), timed where it runs.
        flush, rollups_s = store._flush, [0.0]

        def timed_flush(cur: Any) -> None:
            began = time.perf_counter()
            flush(cur)
            rollups_s[0] += time.perf_counter() - began

        store._flush = timed_flush  # type: ignore[method-assign]
        t3 = time.perf_counter()
        for b in parsed:
            store.submit_batch(b).result()
        t4 = time.perf_counter()
        store.close()
        rollups_us = rollups_s[0] / n * 1e6
    return {
        "json parse + validate": (t1 - t0) / n * 1e6,
        "build chunks (records to columns)": (t2 - t1) / n * 1e6,
        "store (chunks + SQLite insert + commit)": (t4 - t3) / n * 1e6,
        "of which the flush (chunk inserts, rollups)": rollups_us,
        "json.loads alone": _json_loads_us(texts, n),
    }


def _json_loads_us(texts: list[str], n: int) -> float:
    t0 = time.perf_counter()
    for t in texts:
        json.loads(t)
    return (time.perf_counter() - t0) / n * 1e6


async def fill_history(url: str, steps: int, columns: bool = True) -> str:
    """A run of ``steps`` loss-only steps with one spike, sent as columns or as records
    (both stored as chunks); returns its run id."""
    from gradwatch.protocol.columns import to_columns

    run_id = f"history-{'columns' if columns else 'records'}-{uuid.uuid4()}"
    per = 5000
    texts = []
    rng = random.Random(1)
    for seq in range(steps // per):
        records = [
            {"kind": "step", "step": s, "loss": rng.random() + (1e3 if s == 777_777 else 0)}
            for s in range(seq * per, (seq + 1) * per)
        ]
        message: dict[str, Any] = {"type": "batch", "run_id": run_id, "rank": 0, "seq": seq}
        if columns:
            message["records"], message["columns"] = to_columns(records)
        else:
            message["records"] = records
        texts.append(json.dumps(message))
    window = argparse.Namespace(window=8, window_bytes=WINDOW_BYTES)
    await trainer(url, run_id, texts, window, _set_event())
    return run_id


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def bench_backend(name: str, db: str, args: argparse.Namespace, workers: int = 1) -> None:
    server = Server(db, workers=workers)
    url = server.http.replace("http://", "ws://")
    try:
        rates: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeat):
            for encoding in args.encoding:
                for n in args.trainers:
                    rate = asyncio.run(one_round(url, n, args.records, args, encoding))
                    rates.setdefault((encoding, n), []).append(rate)
        for encoding in args.encoding:
            line = "  ".join(
                f"{n:>2} trainers: {statistics.median(rates[encoding, n]):>8,.0f} rec/s"
                f" ({min(rates[encoding, n]) / 1e3:.1f}k-{max(rates[encoding, n]) / 1e3:.1f}k)"
                for n in args.trainers
            )
            print(f"{name:<10} {encoding:<6} {line}")
        if args.history_steps:
            for columns in (False, True):
                run_id = asyncio.run(fill_history(url, args.history_steps, columns))
                times = []
                for _ in range(3):
                    elapsed, answer = server.get(
                        f"/api/runs/{run_id}/steps?fields=loss&max_points=2000"
                    )
                    times.append(elapsed)
                points = len(answer["fields"]["loss"]["step"])
                spike = 777_777 in answer["fields"]["loss"]["step"]
                window, _ = server.get(
                    f"/api/runs/{run_id}/steps?fields=loss&from=123457&to=876543&max_points=2000"
                )
                stored = "columns" if columns else "records"
                print(
                    f"{name:<10} history ({stored}): {answer['total']:,} steps -> {points}"
                    f" points (min/max), median {statistics.median(times) * 1000:,.0f} ms;"
                    f" spike kept: {spike}; a window cut mid-bucket: {window * 1000:,.0f} ms"
                )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--records", type=int, default=16_000, help="records per round")
    parser.add_argument("--batch", type=int, default=100, help="records per batch")
    parser.add_argument(
        "--window",
        type=int,
        default=WINDOW_BATCHES,
        help="batches in flight per trainer (the sender's default)",
    )
    parser.add_argument(
        "--window-bytes",
        type=int,
        default=WINDOW_BYTES,
        help="bytes in flight per trainer (the sender's default)",
    )
    parser.add_argument("--timesteps", type=int, default=128)
    parser.add_argument("--params", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--encoding",
        nargs="+",
        choices=["lists", "packed", "columns"],
        default=["columns"],
        help="step records as packed columns (batch.columns: what trainers send), or with"
        " timestep series as JSON lists of numbers, or packed {'f64': base64}; several are"
        " interleaved (on PostgreSQL the slower ones leave dirty buffers to the next)",
    )
    parser.add_argument("--history-steps", type=int, default=1_000_000)
    parser.add_argument("--postgres", default=None, help="also run against this PostgreSQL URL")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the in-process stages")
    parser.add_argument(
        "--pg-workers",
        type=int,
        nargs="+",
        default=[1],
        help="with --postgres: `gradwatch serve --workers N` for each N given",
    )
    args = parser.parse_args()
    sizes = {
        e: len(json.dumps(step_record(0, random.Random(0), args.timesteps, args.params, p)))
        for e, p in (("lists", False), ("packed", True))
    }
    sizes["columns"] = len(encode_batches("size", 1, 100, args, "columns")[0]) // 100
    print(
        f"record: 2 modules x {args.timesteps} timesteps, {args.params} parameter norms,"
        f" {sizes['lists']:,} bytes of JSON with lists, {sizes['packed']:,} packed,"
        f" {sizes['columns']:,} in columns;"
        f" {args.batch} records per batch, in flight per trainer at most {args.window}"
        f" batches and {args.window_bytes / 2**20:g} MiB;"
        f" median of {args.repeat} rounds of {args.records:,} records; {os.cpu_count()} CPUs"
    )
    for encoding in [] if args.no_breakdown else args.encoding:
        stages = breakdown(args, encoding)
        print(
            f"server time per record, {encoding} (in-process): "
            + ", ".join(f"{k} {v:.1f} us" for k, v in stages.items())
        )
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as folder:
            bench_backend("sqlite", str(Path(folder) / "bench.db"), args)
    if args.postgres:
        import psycopg

        schema = "bench_" + uuid.uuid4().hex[:8]
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            sep = "&" if "?" in args.postgres else "?"
            for workers in args.pg_workers:
                name = "postgresql" if workers == 1 else f"pg x{workers}"
                db = f"{args.postgres}{sep}options=-csearch_path%3D{schema}"
                bench_backend(name, db, args, workers)
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
