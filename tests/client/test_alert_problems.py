"""One problem, one card: alerts grouped by cause, counted as problems everywhere.

The alert records come from the real diagnosis engine (which stamps ``problem`` and
``opens_problem``), travel over a real websocket to a real server, and are shown by
the dashboard in a real Chromium.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine

from .conftest import step_record, wait_js

pytestmark = pytest.mark.browser


def stale(step: int, subject: str) -> dict[str, Any]:
    """The capture's stale-state alert (trainer_hooks/quantities/stale.py) for one module."""
    return {
        "kind": "alert", "step": step, "code": "graph_growth", "severity": "error",
        "state": "raised", "subject": subject, "t": time.time(),
        "message": f"{subject} received a hidden state still attached to step {step - 1}'s graph",
        "hint": "Detach the carried state: h = h.detach()", "evidence": {},
    }  # fmt: skip


def engine_records() -> list[dict[str, Any]]:
    """rotation_lstm's bug as the engine sees it: three stale modules, a growing graph,
    and (another cause) vanishing on lstm1 that later clears."""
    engine = DiagnosisEngine({"raise_after": 1, "clear_after": 2})
    out: list[dict[str, Any]] = []
    vanishing = {"lstm1": {"input": [1e-30] * 90 + [1.0] * 31}}
    healthy = {"lstm1": {"input": [1.0] * 121}}
    for n in range(12):
        record = {"kind": "step", "step": n, "t": time.time(), "graph_nodes": 100 * (n + 1),
                  "timesteps": vanishing if n < 6 else healthy}  # fmt: skip
        out.append(record)
        out += engine.observe(record)
        if n == 1:
            for subject in ("lstm1", "lstm2", "lstm3"):
                alert = stale(n, subject)
                engine.observe(alert)  # stamps problem / opens_problem in place
                out.append(alert)
    return [r for r in out if r["kind"] == "alert"]


def api(server: Any, path: str) -> Any:
    with urllib.request.urlopen(server.http + path, timeout=10) as answer:  # noqa: S310
        return json.loads(answer.read())


def test_alerts_of_one_cause_are_one_card_and_every_count_counts_problems(
    gradwatch_server, open_page, raw_trainer
):
    alerts = engine_records()
    codes = sorted({(a["code"], a["subject"]) for a in alerts})
    assert codes == [("graph_growth", s) for s in ("graph", "lstm1", "lstm2", "lstm3")] + [
        ("vanishing", "lstm1")
    ]
    server = gradwatch_server()
    trainer = raw_trainer(server, "rotation")
    trainer.send([step_record(s) for s in range(12)] + alerts)
    # the API: the run counts 2 problems; every record stays available
    (run,) = [r for r in api(server, "/api/runs") if r["id"] == trainer.run_id]
    assert run["alerts"] == 2
    assert len(api(server, f"/api/runs/{trainer.run_id}/alerts")) == len(alerts) > 5

    w = open_page(server)
    row = f"tr[data-run-id='{trainer.run_id}'] .count-alerts"
    w.page.wait_for_selector(row)
    assert w.page.inner_text(row) == "2"
    w.page.goto(f"{server.http}/#/run/{trainer.run_id}")
    w.page.wait_for_selector("#alerts-list article.alert[data-problem=graph_growth]")
    cards = w.page.eval_on_selector_all(
        "#alerts-list article.alert", "cs => cs.map(c => [c.dataset.problem, c.dataset.members])"
    )
    assert cards == [["graph_growth", "4"], ["vanishing:lstm1", "1"]]
    graph = w.page.inner_text("#alerts-list article.alert[data-problem=graph_growth]")
    assert "lstm1, lstm2, lstm3, graph" in graph and "h.detach()" in graph
    # a cleared card keeps the message and the fix that belong together
    vanished = w.page.inner_text("#alerts-list article.alert[data-problem='vanishing:lstm1']")
    assert "gradient reaches back only 31 of 121 timesteps" in vanished
    assert "no longer holds" in vanished and "truncated BPTT" in vanished
    wait_js(w.page, "() => document.body.textContent.includes('2 alerts')")
    assert w.errors == [], w.errors
