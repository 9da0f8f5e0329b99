"""Make the dashboard screenshots in docs/img: every view, light and dark.

Starts a throwaway ``gradwatch serve`` on loopback, trains examples/long_lstm.py (the
bug and its --fixed twin) and examples/seq2seq_attention.py (with profiling) into it,
and examples/tiny_gpt.py (its padded batch at step 80), then photographs the runs list,
the run view, compare, replay and the transformer's depth panels in headless Chromium.

    .venv/bin/python docs/img/shoot.py [DB]       # Chromium from $GRADWATCH_CHROMIUM
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
REPLAYED = """() => (document.getElementById('replay-label') || {}).textContent
    ?.startsWith('replayed')"""
# Every chart drawn, and nothing left in a backlog (the run view or the one a replay feeds).
ALL_DRAWN = """() => { const s = window.gradwatch.state.view; const v = s && (s.view || s);
    const charts = v && v.allCharts ? v.allCharts() : [];
    return [...document.querySelectorAll('.chart:not([hidden])')].every(d => d.data)
        && charts.every(c => c.drawn && !c.backlog.length); }"""
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
        return json.loads(answer.read())


def wait_up(http: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            get(http + "/api/health")
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"expected the server to answer on {http}, got nothing in {deadline_s} s")


def train(ws: str) -> None:
    runs = [["long_lstm.py", "--steps", "80"], ["long_lstm.py", "--steps", "80", "--fixed"],
            ["seq2seq_attention.py", "--steps", "30"],
            ["tiny_gpt.py", "--steps", "120"]]  # fmt: skip
    extra = ["--server", ws, "--quiet", "--max-seconds", "60"]
    examples = ROOT / "examples"
    procs = [subprocess.Popen([sys.executable, str(examples / r[0]), *r[1:], *extra]) for r in runs]
    for p in procs:
        if p.wait(timeout=300) != 0:
            raise RuntimeError(f"expected the example to finish, got exit code {p.returncode}")


def shoot(http: str) -> None:
    from playwright.sync_api import sync_playwright

    runs = {r["name"]: r["id"] for r in get(http + "/api/runs")}  # type: ignore[union-attr]
    bug, fixed = runs["long_lstm"], runs["long_lstm-fixed"]
    views = {"runs": "#/", "run": f"#/run/{bug}", "compare": f"#/compare/{bug}/{fixed}",
             "replay": f"#/replay/{bug}", "depth": f"#/run/{runs['tiny_gpt']}"}  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        for theme in ("light", "dark"):
            ctx = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme=theme)
            page = ctx.new_page()
            for name, hash_ in views.items():
                page.goto(f"{http}/{hash_}")
                page.wait_for_selector("body[data-painted='1']")
                if name == "replay":
                    page.wait_for_function(REPLAYED, timeout=60_000)
                page.emulate_media(media="print")  # every chart drawn
                page.wait_for_function(ALL_DRAWN)
                page.emulate_media(media="screen")
                page.wait_for_timeout(1000)  # Plotly's resize after the media switch
                page.screenshot(path=str(OUT / f"{name}-{theme}.png"), full_page=name != "runs")
            ctx.close()
        browser.close()


def main() -> None:
    port = free_port()
    http, ws = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        # A database given as the first argument is kept, and trained into only once.
        db = sys.argv[1] if len(sys.argv) > 1 else f"{tmp}/shots.db"
        serve = ["serve", "--host", "127.0.0.1", "--port", str(port), "--db", db]
        server = subprocess.Popen([sys.executable, "-m", "gradwatch.server.cli", *serve])
        try:
            wait_up(http)
            if not get(http + "/api/runs"):
                train(ws)
            shoot(http)
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
