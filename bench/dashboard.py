"""Dashboard benchmark: first paint of a 1e6-step run, and sustained live updates.

1. First paint. A real `gradwatch serve` holds two runs ingested over /ws/ingest: 1e3
   and 1e6 steps (a heatmap row every 1,000 steps for the long one, every step for
   the short one). Headless Chromium opens each run view; "first paint" is
   performance.now() when every chart of the view has drawn (the dashboard records
   it in window.gradwatch.stats.paintedAt), i.e. from navigation start, Plotly.js
   parse included. Median of --repeats loads, side by side, with the ratio.
2. Live. 8 trainers stream one step record (121-timestep heatmap row, 20 parameter
   norms) every 100 ms each (10 steps/s per run) for --seconds; one Chromium page
   per run watches its run view. A requestAnimationFrame counter in each page counts
   frames and frames longer than 50 ms. Run twice: records drawn once per animation
   frame (the dashboard) and once per message (window.gradwatch.unbatched), side by side.

3. Cost of leaving it open (--only cpu). Real trainer sinks (gradwatch's own
   WebSocketSink: columns, packed series, acks) stream step records at --rate steps/s
   per run into a real `gradwatch serve`: one run watched in its run view, and 8 runs
   on the runs list. The renderer's main thread is read from Chromium itself (CDP
   Performance.getMetrics): TaskDuration (main-thread tasks, wall time), ThreadTime
   (its CPU time), and the Script / Layout / RecalcStyle parts, over a window of
   --seconds after the page has painted, as a share of one core. With --baseline REF
   the client of git REF (client/ as it was there, served through page.route) is
   measured in the same process, blocks alternating: before / after side by side.

Run: .venv/bin/python bench/dashboard.py [--steps 1000000] [--seconds 20] [--repeats 5]
     .venv/bin/python bench/dashboard.py --only cpu --seconds 30 --blocks 2 --baseline 170c7c3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from dashboard_runs import Streams, hello, ingest, step_record  # bench/, beside this file
from serve import Server
from websockets.sync.client import connect

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]  # fmt: skip


def first_paint(browser: Any, server: Server, run_id: str) -> tuple[float, float, float]:
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(f"{server.http}/#/run/{run_id}")
    page.wait_for_selector("body[data-painted='1'][data-scalars='1']", timeout=120_000)
    painted = page.evaluate("() => window.gradwatch.stats.paintedAt")
    scalars = page.evaluate("() => window.gradwatch.stats.scalarsAt")
    api = page.evaluate(
        "() => Math.max(...performance.getEntriesByType('resource')"
        ".filter(e => e.name.includes('/steps') || e.name.includes('/timesteps'))"
        ".map(e => e.responseEnd - e.startTime))"
    )
    page.close()
    return float(painted), float(scalars), float(api)


FLOOR_PAGE = """<!doctype html><html><body><div id="c" style="width:600px;height:400px"></div>
<script src="/static/vendor/plotly.min.js"></script>
<script>Plotly.newPlot("c", [{y: [1, 3, 2]}]).then(() => { window.floorAt = performance.now(); });
</script></body></html>"""


def plotly_floor(browser: Any, server: Server) -> float:
    """The same Plotly.js from the same server, parsed and drawing one tiny chart: the
    part of first paint no dashboard code can remove."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.route(f"{server.http}/__floor", lambda route: route.fulfill(
        body=FLOOR_PAGE, content_type="text/html"))  # fmt: skip
    page.goto(f"{server.http}/__floor")
    page.wait_for_function("() => window.floorAt !== undefined", timeout=120_000)
    floor = float(page.evaluate("() => window.floorAt"))
    page.close()
    return floor


COUNTER = """() => {
  const s = {frames: 0, long: 0, worst: 0, last: performance.now()};
  window.__frames = s;
  const tick = (t) => { const d = t - s.last; s.last = t; s.frames += 1;
    if (d > 50) s.long += 1; s.worst = Math.max(s.worst, d); requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""


def live(
    browser: Any, server: Server, runs: int, seconds: float, unbatched: bool
) -> dict[str, float]:
    trainers = [(str(uuid.uuid4()), f"live-{i}") for i in range(runs)]
    sockets = []
    for run_id, name in trainers:
        ws = connect(server.url + "/ws/ingest")
        ws.__enter__()
        ws.send(hello(run_id, name))
        ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": 0, "seq": 0,
                            "records": [step_record(0, True)]}))  # fmt: skip
        ws.recv(timeout=30)
        sockets.append(ws)
    pages = []
    for run_id, _ in trainers:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{server.http}/#/run/{run_id}")
        page.wait_for_selector("body[data-painted='1']", timeout=60_000)
        if unbatched:
            page.evaluate("() => { window.gradwatch.unbatched = true; }")
        pages.append(page)
    for page in pages:
        page.evaluate(COUNTER)
    stop = threading.Event()

    def stream(ws: Any, run_id: str) -> None:
        seq, step = 1, 1
        next_at = time.monotonic()
        while not stop.is_set():
            ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": 0, "seq": seq,
                                "records": [step_record(step, True)]}))  # fmt: skip
            ws.recv(timeout=30)
            seq, step = seq + 1, step + 1
            next_at += 0.1
            stop.wait(max(0.0, next_at - time.monotonic()))

    threads = [
        threading.Thread(target=stream, args=(ws, run_id))
        for ws, (run_id, _) in zip(sockets, trainers, strict=True)
    ]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    stop.wait(seconds)  # the measurement window itself
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    frames = [p.evaluate("() => window.__frames") for p in pages]
    drawn = [p.evaluate("() => window.gradwatch.stats.flushedItems") for p in pages]
    heat_rows = "() => document.querySelector('[id^=chart-heatmap]').data[0].z.length"
    rows = [p.evaluate(heat_rows) for p in pages]
    for p in pages:
        p.close()
    for ws in sockets:
        ws.__exit__(None, None, None)
    total_frames = sum(f["frames"] for f in frames)
    return {
        "fps_per_page": total_frames / len(pages) / elapsed,
        "long_frames_pct": 100 * sum(f["long"] for f in frames) / max(1, total_frames),
        "worst_frame_ms": max(f["worst"] for f in frames),
        "records_drawn_per_s": sum(drawn) / elapsed,
        "heatmap_rows_min": min(rows),
    }


def baseline_client(ref: str, into: Path) -> Path:
    """client/ as it was at git ``ref``, extracted under ``into``."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref, "client"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "client"


def open_measured(browser: Any, server: Server, hash_: str, client: Path | None) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    if client is not None:  # the baseline arm: the old client's files, same server

        def old_file(route: Any) -> None:
            path = route.request.url.split("/static/", 1)[1].split("?")[0]
            kind = "text/css" if path.endswith(".css") else "text/javascript"
            route.fulfill(body=(client / path).read_bytes(), content_type=kind)

        page.route(f"{server.http}/static/js/**", old_file)
        # (index.html comes from the server in both arms: a fulfilled document would
        # count as a public page, and Chromium blocks its websocket to 127.0.0.1)
        page.route(f"{server.http}/static/style.css", old_file)
    page.goto(f"{server.http}/{hash_}")
    page.wait_for_selector("body[data-painted='1']", timeout=60_000)
    return page


METRICS = ("TaskDuration", "ThreadTime", "ScriptDuration", "LayoutDuration",
           "RecalcStyleDuration")  # fmt: skip


def main_thread(pages: list[Any], seconds: float) -> dict[str, float]:
    """Each metric's growth over ``seconds``, summed over pages, as a share of one core."""
    sessions = [p.context.new_cdp_session(p) for p in pages]
    for cdp in sessions:
        cdp.send("Performance.enable")

    def read() -> list[dict[str, float]]:
        return [{m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                for cdp in sessions]  # fmt: skip

    count = "() => window.gradwatch.stats.records"
    before, t0, seen = read(), time.monotonic(), [p.evaluate(count) for p in pages]
    time.sleep(seconds)  # the measurement window itself
    after, elapsed = read(), time.monotonic() - t0
    seen = [p.evaluate(count) - s for p, s in zip(pages, seen, strict=True)]
    out = {m: sum(a.get(m, 0) - b.get(m, 0) for a, b in zip(after, before, strict=True)) / elapsed
           for m in METRICS}  # fmt: skip
    out["records_per_s"] = sum(seen) / elapsed  # records the page received (run view)
    return out


def cpu_table(browser: Any, server: Server, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = baseline_client(args.baseline, Path(tmp)) if args.baseline else None
        arms = [("before", old), ("after", None)] if old is not None else [("now", None)]
        print(f"\nmain thread of the renderer, % of one core, {args.seconds:.0f} s windows, "
              f"{args.blocks} blocks per arm, alternating; load average {load()}")  # fmt: skip
        head = ("view", "client", "Task", "Thread CPU", "Script", "Layout", "Style", "rec/s")
        print("{:>26} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6} {:>6}".format(*head))
        for label, runs, hash_of in (
            (f"run view, 1 run x {args.rate:g}/s", 1, lambda ids: f"#/run/{ids[0]}"),
            (f"runs list, {args.runs} runs x {args.rate:g}/s", args.runs, lambda ids: "#/"),
        ):
            streams = Streams(server, runs, args.rate)
            try:
                results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in arms}
                for _ in range(args.blocks):
                    for name, client in arms:
                        page = open_measured(browser, server, hash_of(streams.ids), client)
                        time.sleep(2)  # let the first paint's idle-time drawing finish
                        results[name].append(main_thread([page], args.seconds))
                        page.close()
                for name, _ in arms:
                    blocks = results[name]
                    r = {k: statistics.median(b[k] for b in blocks) for k in blocks[0]}
                    pct = {k: 100 * v for k, v in r.items()}
                    print(f"{label:>26} {name:>7} {pct['TaskDuration']:5.1f}% "
                          f"{pct['ThreadTime']:9.1f}% {pct['ScriptDuration']:6.1f}% "
                          f"{pct['LayoutDuration']:6.1f}% {pct['RecalcStyleDuration']:5.1f}% "
                          f"{r['records_per_s']:6.1f}")  # fmt: skip
            finally:
                streams.close()
        print(f"load average at the end {load()}")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def paint_table(browser: Any, server: Server, runs: dict[str, str], repeats: int) -> None:
    first_paint(browser, server, next(iter(runs.values())))  # warm the cache of plotly.min.js
    results = {}
    for label, run_id in runs.items():
        loads = [first_paint(browser, server, run_id) for _ in range(repeats)]
        results[label] = [statistics.median(r[i] for r in loads) for i in range(3)]
    print(f"\nrun view, median of {repeats} loads, ms from navigation start")
    print(f"{'run':>14} {'first paint':>12} {'all charts':>11} {'slowest API':>12}")
    for label, (paint, scalars, api) in results.items():
        print(f"{label:>14} {paint:12.0f} {scalars:11.0f} {api:12.0f}")
    (a, sa, _), (b, sb, _) = results.values()
    print(f"{'ratio':>14} {b / a:12.2f} {sb / sa:11.2f}")
    floor = statistics.median(plotly_floor(browser, server) for _ in range(repeats))
    print(f"{'Plotly alone':>14} {floor:12.0f}   (plotly.min.js parsed + one tiny chart)")


def live_table(browser: Any, server: Server, runs: int, seconds: float) -> None:
    print(f"\nlive: {runs} runs x 10 steps/s, one page per run, {seconds:.0f} s")
    head = ("drawing", "fps/page", "frames>50ms", "worst ms", "records/s", "rows")
    print("{:>22} {:>9} {:>12} {:>9} {:>10} {:>5}".format(*head))
    for label, unbatched in (("per animation frame", False), ("per message", True)):
        r = live(browser, server, runs, seconds, unbatched)
        print(
            f"{label:>22} {r['fps_per_page']:9.1f} {r['long_frames_pct']:11.1f}% "
            f"{r['worst_frame_ms']:9.0f} {r['records_drawn_per_s']:10.1f} "
            f"{r['heatmap_rows_min']:5.0f}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--only", choices=("paint", "live", "cpu"), default=None, help="one part only")
    ap.add_argument("--rate", type=float, default=10.0, help="cpu: steps/s per run")
    ap.add_argument("--blocks", type=int, default=2, help="cpu: windows per arm, alternating")
    ap.add_argument("--baseline", default=None, help="cpu: also measure the client of this git ref")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = Server(str(Path(tmp) / "bench.db"), quiet=True)
        try:
            runs = {}
            if args.only in (None, "paint"):
                t0 = time.perf_counter()
                runs["1e3 steps"] = ingest(server, "short", 1000, 1)
                runs[f"{args.steps:.0e} steps"] = ingest(server, "long", args.steps, 1000)
                took = time.perf_counter() - t0
                print(f"ingested 1,000 + {args.steps:,} steps in {took:.1f} s")
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
                )
                if args.only in (None, "paint"):
                    paint_table(browser, server, runs, args.repeats)
                if args.only in (None, "live"):
                    live_table(browser, server, args.runs, args.seconds)
                if args.only in (None, "cpu"):
                    cpu_table(browser, server, args)
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
