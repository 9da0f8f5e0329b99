"""Browser-test plumbing: headless Chromium through Playwright, a page that records
console errors and every request, and a trainer-like websocket client that streams
protocol-valid records into a real gradwatch server.

Chromium is Debian's (`chromium_path` fixture: skips loudly on a dev box without it,
fails in CI); Playwright never downloads a browser here.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclass
class Watched:
    """A page plus what it did: console errors, page errors, every request URL."""

    page: Any
    origin: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    # (url, its Authorization header or None) of every HTTP request
    authorization: list[tuple[str, str | None]] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        """Requests that left the server's origin (data: URLs are in-page, not requests)."""
        out = []
        for url in self.requests:
            parts = urlsplit(url)
            if parts.scheme in ("data", "blob"):
                continue
            if f"{parts.hostname}:{parts.port}" != self.origin:
                out.append(url)
        return out

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """open_page(server, "#/run/ID") -> Watched, at 1440x900 (or viewport=), errors recorded;
    ``prepare(page)`` runs before the page loads (routes)."""
    contexts: list[Any] = []

    def open_(
        server: Any,
        hash_: str = "#/",
        query: str = "",
        prepare: Callable[[Any], None] | None = None,
        **context_args: Any,
    ) -> Watched:
        context_args.setdefault("viewport", {"width": 1440, "height": 900})
        ctx = browser.new_context(**context_args)
        contexts.append(ctx)
        page = ctx.new_page()
        watched = Watched(page, f"127.0.0.1:{server.port}")
        page.on("console", lambda m: watched.errors.append(f"console.{m.type}: {m.text}")
                if m.type == "error" else None)  # fmt: skip
        page.on("pageerror", lambda e: watched.errors.append(f"pageerror: {e}"))
        page.on("request", lambda r: (watched.requests.append(r.url), watched.authorization
                                      .append((r.url, r.headers.get("authorization")))))
        page.on("websocket", lambda w: watched.requests.append(w.url))
        if prepare is not None:
            prepare(page)
        page.goto(f"{server.http}/{query}{hash_}")
        return watched

    yield open_
    for ctx in contexts:
        ctx.close()


def vanishing_profile(n: int = 121, factor: float = 0.78) -> list[float]:
    """Per-timestep norms of an LSTM with the loss on its last step: early ones vanish."""
    return [0.5 * factor ** (n - 1 - t) for t in range(n)]


def step_record(step: int, *, timesteps: int = 121, nonfinite: bool = False) -> dict[str, Any]:
    """A protocol-valid step record with every field the dashboard draws."""
    profile: list[Any] = vanishing_profile(timesteps)
    total: Any = 0.8 + 0.1 * math.sin(step / 5)
    rec: dict[str, Any] = {
        "kind": "step", "step": step, "epoch": step // 20, "t": time.time(),
        "duration_s": 0.01 + 0.0002 * step, "loss": 1.0 / (1 + step), "overhead": 0.03,
        "timesteps": {"lstm": {"input": profile}},
        "param_norms": {"lstm.weight_ih_l0": 0.3, "lstm.weight_hh_l0": 0.5, "head.weight": 0.2},
        "gate_norms": {"lstm.weight_hh_l0": {"i": 0.1, "f": 0.2, "g": 0.3, "o": 0.15}},
        "total_norm": total, "graph_nodes": 40 + step, "rss_bytes": 200_000_000 + step * 1000,
    }  # fmt: skip
    if nonfinite:
        rec["total_norm"] = "NaN"
        rec["nonfinite"] = {
            "parameters": ["lstm.weight_hh_l0"],
            "timesteps": {"lstm": {"input": 3}},
        }
    return rec


def alert_record(step: int, code: str = "vanishing", subject: str = "lstm") -> dict[str, Any]:
    """An alert as the diagnoses emit it (docs/PROTOCOL.md)."""
    return {
        "kind": "alert", "step": step, "code": code, "severity": "warning", "state": "raised",
        "subject": subject, "t": time.time(),
        "message": f"{subject}: gradient reaches back only 20 of 121 timesteps",
        "hint": "Train with truncated BPTT in chunks of about 20 timesteps",
        "evidence": {"horizon": 101, "reach": 20, "suggested_truncation": 20},
    }  # fmt: skip


def end_record(step: int, status: str = "finished") -> dict[str, Any]:
    return {"kind": "end", "status": status, "step": step, "t": time.time()}


def assert_clean(w: Watched) -> None:
    """No console or page error, and no request left the server's origin."""
    assert w.errors == [], w.errors
    assert w.foreign_requests() == [], w.foreign_requests()


def wait_js(page: Any, predicate: str, timeout_s: float = 30.0) -> Any:
    """Wait until the JS arrow function ``predicate`` is truthy in the page.

    A function (not an expression string) because the server's CSP forbids eval,
    and Playwright evaluates expression strings with eval.
    """
    return page.wait_for_function(predicate, timeout=timeout_s * 1000)


def scroll_to(page: Any, chart_id: str) -> None:
    """Bring a chart into view and wait until it is drawn.

    The run view draws a chart when it first scrolls into view and keeps its live
    points while it is off screen (client/js/lazy.js).
    """
    page.locator(f"#{chart_id}").scroll_into_view_if_needed()
    wait_js(page, f"() => !!document.getElementById({json.dumps(chart_id)}).data")


def wait_points(page: Any, chart_id: str, count: int, timeout_s: float = 30.0) -> None:
    """Wait until the first trace of a chart has ``count`` points."""
    trace = f"(document.getElementById({json.dumps(chart_id)}).data || [])[0]"
    done = f"() => {{ const t = {trace}; return !!t && t.x.length === {count}; }}"
    wait_js(page, done, timeout_s)


def chart(page: Any, chart_id: str, expr: str) -> Any:
    """Evaluate ``expr`` on the Plotly div ``chart_id`` (its data/layout), as `d`."""
    find = f"document.getElementById({json.dumps(chart_id)})"
    return page.evaluate(f"() => {{ const d = {find}; return {expr}; }}")


class RawTrainer:
    """A trainer-like client speaking protocol v1 on /ws/ingest, waiting for each ack."""

    def __init__(
        self,
        server: Any,
        name: str,
        run_id: str | None = None,
        token: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        config: dict[str, Any] | None = None,
    ) -> None:
        from websockets.sync.client import connect

        self.run_id = run_id or str(uuid.uuid4())
        self.rank = rank
        self.seq = 0
        query = f"?token={token}" if token else ""
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(server.url + "/ws/ingest" + query))
        self.ws.send(json.dumps({
            "type": "hello", "protocol": 1, "run_id": self.run_id, "run": name, "rank": rank,
            "world_size": world_size, "host": "test-box", "pid": 1,
            "model": {"modules": [{"name": "lstm", "type": "LSTM"}], "parameters": 100,
                      "recurrent": ["lstm"]},
            "config": {"every": 1} if config is None else config,
        }))  # fmt: skip

    def send(self, records: list[dict[str, Any]]) -> None:
        self.ws.send(json.dumps({"type": "batch", "run_id": self.run_id, "rank": self.rank,
                                 "seq": self.seq, "records": records}))  # fmt: skip
        answer = json.loads(self.ws.recv(timeout=30))
        # "live" says whether a page watches the run: some tests open it first
        assert (answer["type"], answer["seq"], type(answer["live"])) == ("ack", self.seq, bool)
        self.seq += 1

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def raw_trainer() -> Iterator[Any]:
    made: list[RawTrainer] = []

    def make(
        server: Any,
        name: str,
        run_id: str | None = None,
        token: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        config: dict[str, Any] | None = None,
    ) -> RawTrainer:
        t = RawTrainer(server, name, run_id, token, rank, world_size, config)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
