"""`gradwatch report RUN -o run.html`: a standalone file that draws in Chromium with
every network request blocked, shows the alerts with their fixes, and keeps names as text.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ARTIFACTS, alert_record, end_record, step_record

HOSTILE = "<script>alert(1)</script>"


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "report", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def finished_run(gradwatch_server, gradwatch_db: str, raw_trainer) -> tuple[Any, Any]:
    """A finished run in a real store: SQLite, and PostgreSQL where one is configured."""
    server = gradwatch_server(db=gradwatch_db)
    trainer = raw_trainer(server, HOSTILE)
    records = [step_record(s, nonfinite=s == 7) for s in range(30)]
    records += [alert_record(12), {"kind": "epoch", "epoch": 0, "step": 19, "t": 0.0,
                                   "duration_s": 0.4, "steps": 20}, end_record(29)]  # fmt: skip
    trainer.send(records)
    return server, trainer


@pytest.mark.browser
def test_report_draws_offline_with_alerts_and_names_as_text(
    finished_run, browser: Any, tmp_path: Path
):
    server, trainer = finished_run
    out = tmp_path / "run.html"
    done = report(trainer.run_id, "-o", str(out), "--db", server.db)
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    assert HOSTILE not in html  # escaped wherever it appears
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script src=" not in html  # Plotly is inline

    requests: list[str] = []
    errors: list[str] = []
    dialogs: list[str] = []
    # One Playwright per session (the `browser` fixture): a second one in the same
    # process would find the first one's event loop running.
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()

    def block(route: Any) -> None:
        requests.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", block)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-painted='1']", timeout=60_000)
    assert page.inner_text("#run-name") == HOSTILE
    rows = "d => d.data[0].z.length"
    assert page.eval_on_selector("[id^=chart-heatmap]", rows) == 30
    assert page.eval_on_selector("#chart-profile", "d => d.data[0].y.length") == 121
    marks = "d => d.data.filter(t => t.name === 'non-finite').flatMap(t => t.x)"
    assert page.eval_on_selector("#chart-norms", marks) == [7]
    assert page.eval_on_selector("#chart-time", "d => d.data[0].x.length") == 30
    alert = page.inner_text("#panel-alerts")
    assert "gradient reaches back only 20 of 121 timesteps" in alert
    assert "truncated BPTT" in page.inner_text("#panel-alerts .fix")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    context.close()
    assert [u for u in requests if not u.startswith("file://")] == []
    assert errors == []
    assert dialogs == []


def test_a_recurrent_module_without_rows_is_named_with_why(
    gradwatch_server: Any, tmp_path: Path
) -> None:
    """As the run view: a module the hello names that never sent a row gets a panel
    saying so (its name as text), beside the heatmap of the one that did."""
    import json

    from websockets.sync.client import connect

    server = gradwatch_server()
    frozen = "<b>frozen</b>"
    with connect(server.url + "/ws/ingest") as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run_id": "silent", "run": "silent",
                            "model": {"recurrent": ["lstm", frozen]}}))
        ws.send(json.dumps({"type": "batch", "run_id": "silent", "rank": 0, "seq": 0,
                            "records": [step_record(s) for s in range(3)] + [end_record(2)]}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ack", "seq": 0, "live": False}
    out = tmp_path / "silent.html"
    done = report("silent", "-o", str(out), "--db", server.db)
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    assert 'id="chart-heatmap-0-0"' in html  # lstm's rows
    shown = "&lt;b&gt;frozen&lt;/b&gt;"
    assert frozen not in html
    assert f"Gradient flow through time: {shown}</h2>" in html
    assert f"No per-timestep gradient reached {shown} in the recorded steps." in html
    assert html.count("No per-timestep gradient reached") == 1


def test_report_finds_a_run_by_name(finished_run, tmp_path: Path):
    server, trainer = finished_run
    out = tmp_path / "by-name.html"
    done = report(HOSTILE, "-o", str(out), "--db", server.db)
    assert done.returncode == 0, done.stderr
    assert trainer.run_id in out.read_text(encoding="utf-8")


def test_report_of_an_unknown_run_says_what_it_expected(finished_run, tmp_path: Path):
    server, _ = finished_run
    done = report("no-such-run", "-o", str(tmp_path / "x.html"), "--db", server.db)
    assert done.returncode == 2
    assert "expected a run id or name in the database, got 'no-such-run'" in done.stderr
    assert not (tmp_path / "x.html").exists()


def test_report_without_a_database_file_says_so(tmp_path: Path):
    missing = tmp_path / "missing.db"
    done = report("any", "-o", str(tmp_path / "x.html"), "--db", str(missing))
    assert done.returncode == 2
    assert "expected a gradwatch database" in done.stderr
    assert not missing.exists()  # reading a report never creates a database


BIDI = "run\u202egnp.exe \x1b[31mred\x07"
BIDI_SHOWN = "run[U+202E]gnp.exe [U+001B][31mred[U+0007]"


@pytest.mark.browser
def test_report_shows_bidi_and_control_characters_in_names_neutralised(
    gradwatch_server, raw_trainer, browser: Any, tmp_path: Path
):
    server = gradwatch_server()
    trainer = raw_trainer(server, BIDI)
    param = "lstm.\u202eweight_hh"
    records = [{**step_record(s), "param_norms": {param: 0.3, "head.weight": 0.2}}
               for s in range(5)]
    trainer.send([*records, alert_record(2, subject=BIDI), end_record(4)])
    out = tmp_path / "run.html"
    done = report(trainer.run_id, "-o", str(out), "--db", server.db)
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    # Not one invisible control anywhere in the file: title, headings, alerts, charts.
    assert not [c for c in "\u202e\x1b\x07" if c in html]
    figures = html.split('id="gradwatch-figures">', 1)[1].split("</script>", 1)[0]
    assert "lstm.[U+202E]weight_hh" in figures
    assert "\\u202e" not in figures.lower()  # nor escaped inside the charts' JSON
    context = browser.new_context()
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
               else r.abort())
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-painted='1']", timeout=60_000)
    assert page.inner_text("#run-name") == BIDI_SHOWN
    assert page.title() == f"gradwatch report: {BIDI_SHOWN}"
    assert BIDI_SHOWN in page.inner_text("#panel-alerts")
    legends = page.eval_on_selector("#chart-norms", "d => d.data.map(t => String(t.name))")
    assert any("lstm.[U+202E]weight_hh" in n for n in legends), legends
    context.close()
