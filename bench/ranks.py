"""Dashboard with the ranks of a distributed run side by side (issue #7).

1. First paint. A real `gradwatch serve` holds runs of 1, 2 and 8 ranks, each rank
   --steps step records (light records: no heatmap rows), ingested over /ws/ingest.
   Headless Chromium opens each run view; "first paint" is when every chart on screen
   has drawn (window.gradwatch.stats.paintedAt: for a multi-rank run the spread and
   per-rank charts are on screen, so it waits for every rank's history), "ranks ready"
   is when all ranks' series and their spread were computed (stats.ranksAt). Median of
   --repeats loads, side by side, with the ratio to 1 rank.
2. Live. One page watches a run whose 8 ranks each stream a step record every 100 ms
   (80 records/s into one page, the spread chart gaining a point per step) for
   --seconds; frames per second and frames over 50 ms from a requestAnimationFrame
   counter, beside one rank at 10 steps/s.

Run: .venv/bin/python bench/ranks.py [--steps 10000] [--repeats 5] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from dashboard import CHROMIUM_ARGS, COUNTER  # bench/ is the script's folder
from serve import Server
from websockets.sync.client import connect

SPREAD_POINTS = "() => document.getElementById('chart-ranks-spread').data[0].x.length"


def step_record(step: int, rank: int) -> dict[str, Any]:
    slow = 1.5 if rank == 1 else 1.0  # rank 1 a mild straggler, so the spread is not flat
    return {
        "kind": "step", "step": step, "epoch": step // 1000, "t": time.time(),
        "duration_s": slow * (0.01 + 0.001 * random.random()), "loss": 1 / (1 + step),
        "total_norm": 1 + 0.1 * random.random(), "graph_nodes": 120, "rss_bytes": 300_000_000,
    }  # fmt: skip


def hello(run_id: str, name: str, rank: int, world: int) -> str:
    return json.dumps({
        "type": "hello", "protocol": 1, "run_id": run_id, "run": name, "rank": rank,
        "world_size": world, "host": "bench", "pid": 1 + rank,
        "model": {"modules": [{"name": "fc", "type": "Linear"}]}, "config": {},
    })  # fmt: skip


def ingest(server: Server, name: str, ranks: int, steps: int) -> str:
    """Every rank's `steps` records, in batches of 5,000, each acknowledged."""
    run_id = str(uuid.uuid4())
    for rank in range(ranks):
        with connect(server.url + "/ws/ingest", max_size=None, ping_interval=None) as ws:
            ws.send(hello(run_id, name, rank, ranks))
            for seq, start in enumerate(range(0, steps, 5000)):
                records = [step_record(s, rank) for s in range(start, min(steps, start + 5000))]
                ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": rank, "seq": seq,
                                    "records": records}))  # fmt: skip
                assert json.loads(ws.recv(timeout=300))["type"] == "ack"
    return run_id


def first_paint(browser: Any, server: Server, run_id: str, ranks: int) -> tuple[float, float]:
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(f"{server.http}/#/run/{run_id}")
    page.wait_for_selector("body[data-painted='1'][data-scalars='1']", timeout=120_000)
    painted = float(page.evaluate("() => window.gradwatch.stats.paintedAt"))
    if ranks > 1:
        page.wait_for_function("() => window.gradwatch.stats.ranksAt !== null", timeout=120_000)
        spread = page.evaluate(SPREAD_POINTS)
        assert spread > 0, "the spread chart drew no points"
    ready = page.evaluate("() => window.gradwatch.stats.ranksAt")
    page.close()
    return painted, float(ready) if ready is not None else float("nan")


def live(browser: Any, server: Server, ranks: int, seconds: float) -> dict[str, float]:
    run_id = str(uuid.uuid4())
    sockets = []
    for rank in range(ranks):
        ws = connect(server.url + "/ws/ingest")
        ws.__enter__()
        ws.send(hello(run_id, f"live-{ranks}", rank, ranks))
        ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": rank, "seq": 0,
                            "records": [step_record(0, rank)]}))  # fmt: skip
        ws.recv(timeout=30)
        sockets.append(ws)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(f"{server.http}/#/run/{run_id}")
    page.wait_for_selector("body[data-painted='1']", timeout=60_000)
    page.evaluate(COUNTER)
    stop = threading.Event()

    def stream(ws: Any, rank: int) -> None:
        seq, step = 1, 1
        next_at = time.monotonic()
        while not stop.is_set():
            ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": rank, "seq": seq,
                                "records": [step_record(step, rank)]}))  # fmt: skip
            ws.recv(timeout=30)
            seq, step = seq + 1, step + 1
            next_at += 0.1
            stop.wait(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=stream, args=(ws, r)) for r, ws in enumerate(sockets)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    stop.wait(seconds)  # the measurement window itself
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    frames = page.evaluate("() => window.__frames")
    drawn = page.evaluate("() => window.gradwatch.stats.flushedItems")
    spread = 0
    if ranks > 1:
        spread = page.evaluate(SPREAD_POINTS)
    page.close()
    for ws in sockets:
        ws.__exit__(None, None, None)
    return {
        "fps": frames["frames"] / elapsed,
        "long_pct": 100 * frames["long"] / max(1, frames["frames"]),
        "worst_ms": frames["worst"],
        "records_per_s": drawn / elapsed,
        "spread_points": spread,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = Server(str(Path(tmp) / "bench.db"), quiet=True)
        try:
            t0 = time.perf_counter()
            runs = {n: ingest(server, f"ranks-{n}", n, args.steps) for n in (1, 2, 8)}
            print(f"ingested 11 ranks x {args.steps:,} steps in {time.perf_counter() - t0:.1f} s")
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
                )
                first_paint(browser, server, runs[1], 1)  # warm the cache of plotly.min.js
                print(f"\nrun view, {args.steps:,} steps per rank, median of {args.repeats} loads,"
                      " ms from navigation start")  # fmt: skip
                print(f"{'ranks':>6} {'first paint':>12} {'ranks ready':>12} {'paint ratio':>12}")
                base = None
                for n, run_id in runs.items():
                    loads = [first_paint(browser, server, run_id, n) for _ in range(args.repeats)]
                    paint = statistics.median(r[0] for r in loads)
                    ready = statistics.median(r[1] for r in loads)
                    base = base or paint
                    print(f"{n:>6} {paint:12.0f} {ready:12.0f} {paint / base:12.2f}")
                print(f"\nlive: one page, every rank 10 steps/s, {args.seconds:.0f} s")
                head = ("ranks", "fps", "frames>50ms", "worst ms", "records/s", "spread pts")
                print("{:>6} {:>6} {:>12} {:>9} {:>10} {:>11}".format(*head))
                for n in (1, 8):
                    r = live(browser, server, n, args.seconds)
                    print(f"{n:>6} {r['fps']:6.1f} {r['long_pct']:11.1f}% {r['worst_ms']:9.0f} "
                          f"{r['records_per_s']:10.1f} {r['spread_points']:11.0f}")  # fmt: skip
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
