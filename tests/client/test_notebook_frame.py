"""What a notebook shows, in a real browser: the HTML a Monitor (``_repr_html_``) and
``gradwatch.notebook.show()`` produce for a live run, embedded in a page served from
another port (as Jupyter serves its pages), must really render the run's view in its
iframe; a page from an origin that is not allowed gets a refused, empty frame.

The notebook page is served by a small ``http.server`` started in each test and
stopped after it, on 127.0.0.1 (another loopback port: same site as the dashboard) or
under the name ``localhost`` (another site for the browser: the token cookie is not
set there). Names that are not loopback (``jupyter.example``) reach 127.0.0.1 through
Chromium's ``--host-resolver-rules`` in a browser of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHROMIUM_ARGS, scroll_to, step_record, wait_points


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def notebook_page(tmp_path: Path) -> Iterator[Callable[[str], int]]:
    """notebook_page(html) -> the port of a page server on 127.0.0.1 serving it as /."""
    started: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def serve(html: str) -> int:
        folder = tmp_path / f"notebook-{len(started)}"
        folder.mkdir()
        head = '<title>notebook</title><link rel="icon" href="data:,">'  # no favicon 404
        page = f"<!doctype html><html><head>{head}</head><body>{html}</body></html>"
        (folder / "index.html").write_text(page, encoding="utf-8")
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        started.append((httpd, thread))
        return int(httpd.server_address[1])

    yield serve
    for httpd, thread in started:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def open_notebook(browser: Any, url: str, refused: bool = False) -> tuple[Any, list[str]]:
    """A page at ``url`` in a fresh context, with every console message it logs;
    ``refused``: wait for Chromium's message that a frame was refused by CSP."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = ctx.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    if not refused:
        page.goto(url)
        return page, console
    with page.expect_console_message(lambda m: "frame-ancestors" in m.text, timeout=30_000):
        page.goto(url)
    return page, console


def dashboard_frames(page: Any, server: Any) -> list[Any]:
    return [f for f in page.frames if f.url.startswith(server.http + "/")]


def assert_run_view(frame: Any, name: str) -> None:
    """The frame shows the run's view: painted, with the run's name as its title."""
    frame.wait_for_selector("body[data-painted='1'] #run-name", timeout=30_000)
    assert frame.inner_text("#run-name") == name


def test_a_notebook_on_another_loopback_port_shows_the_live_run_in_its_frame(
    gradwatch_server, browser, notebook_page
):
    import torch

    from gradwatch.notebook import view_of
    from gradwatch.trainer_hooks import watch

    server = gradwatch_server()
    model = torch.nn.GRU(3, 8)
    with watch(model, run="nb-frame", server=server.url, diagnose=False) as monitor:

        def train(steps: int) -> None:
            for _ in range(steps):
                out, _ = model(torch.randn(4, 2, 3))
                loss = out.pow(2).mean()
                loss.backward()
                monitor.step(loss)
            assert monitor.flush(30)

        train(3)
        # What Jupyter shows for the monitor, and what show(run_id) shows
        shown = monitor._repr_html_() + view_of(monitor.run_id, server=server.http)._repr_html_()
        assert shown.count("<iframe") == 2, shown
        port = notebook_page(shown)
        page, console = open_notebook(browser, f"http://127.0.0.1:{port}/")
        try:
            frames = dashboard_frames(page, server)
            assert len(frames) == 2, [f.url for f in page.frames]
            for frame in frames:
                assert_run_view(frame, "nb-frame")
            # live: a step trained now arrives in the framed view's loss chart
            scroll_to(frames[0], "chart-loss")
            wait_points(frames[0], "chart-loss", 3)
            train(1)
            wait_points(frames[0], "chart-loss", 4)
            assert not [m for m in console if m.startswith("error")], console
        finally:
            page.context.close()


@pytest.mark.parametrize("notebook_host", ["127.0.0.1", "localhost"])
def test_with_tokens_the_framed_view_reads_and_goes_live(
    gradwatch_server, browser, notebook_page, raw_trainer, monkeypatch, notebook_host
):
    from gradwatch.notebook import view_of

    server = gradwatch_server(token="ingest-secret", view_token="view-only")
    trainer = raw_trainer(server, "private-nb", token="ingest-secret")
    trainer.send([step_record(s) for s in range(3)])
    monkeypatch.setenv("GRADWATCH_VIEW_TOKEN", "view-only")
    shown = view_of(trainer.run_id, server=server.http)._repr_html_()
    port = notebook_page(shown)
    page, _ = open_notebook(browser, f"http://{notebook_host}:{port}/")
    try:
        (frame,) = dashboard_frames(page, server)
        assert_run_view(frame, "private-nb")
        assert frame.evaluate("() => window.location.search") == ""  # the token left it
        # the live socket opened (the token it offered was taken)
        frame.wait_for_function("() => document.getElementById('conn').textContent === 'live'")
        scroll_to(frame, "chart-loss")
        wait_points(frame, "chart-loss", 3)
        trainer.send([step_record(3)])  # the live socket is authorised in the frame
        wait_points(frame, "chart-loss", 4)
        # ...by the token it offers as a subprotocol: under localhost the notebook is
        # another site than 127.0.0.1, and the browser kept no SameSite cookie
        cookies = [c["name"] for c in page.context.cookies() if c["name"].startswith("gradwatch")]
        same_site = notebook_host == "127.0.0.1"
        assert cookies == ([f"gradwatch_token_{server.port}"] if same_site else [])
    finally:
        page.context.close()


@pytest.fixture
def renamed_browser(browser: Any, chromium_path: str) -> Iterator[Any]:
    """A Chromium where any name under .example is 127.0.0.1 (pages from other sites)."""
    args = [*CHROMIUM_ARGS, "--host-resolver-rules=MAP *.example 127.0.0.1"]
    b = browser.browser_type.launch(executable_path=chromium_path, headless=True, args=args)
    yield b
    b.close()


def test_a_page_from_another_site_is_refused_unless_the_server_names_it(
    gradwatch_server, renamed_browser, notebook_page, raw_trainer
):
    from gradwatch.notebook import view_of

    default = gradwatch_server()
    named = gradwatch_server(args=("--frame-ancestor", "http://jupyter.example:*"))
    for server, allowed in ((default, False), (named, True)):
        trainer = raw_trainer(server, "elsewhere")
        trainer.send([step_record(s) for s in range(2)])
        port = notebook_page(view_of(trainer.run_id, server=server.http)._repr_html_())
        url = f"http://jupyter.example:{port}/"
        page, console = open_notebook(renamed_browser, url, refused=not allowed)
        try:
            if allowed:
                (frame,) = dashboard_frames(page, server)
                assert_run_view(frame, "elsewhere")
                continue
            # refused: Chromium says why, and no frame holds the dashboard
            (refusal,) = [m for m in console if "frame-ancestors" in m]
            assert f"Framing '{server.http}/' violates" in refusal, refusal
            assert dashboard_frames(page, server) == [], [f.url for f in page.frames]
        finally:
            page.context.close()
