"""The runs list (start time, duration, status, filter, newest first, archive) and the
replay view (header, EPOCH stat, an honest clock), in real Chromium against a real
server (issue 16)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from .conftest import alert_record, assert_clean, end_record, step_record, wait_js

pytestmark = pytest.mark.browser


def epoch_record(epoch: int, step: int) -> dict[str, Any]:
    return {
        "kind": "epoch",
        "epoch": epoch,
        "step": step,
        "t": time.time(),
        "duration_s": 0.5,
        "steps": 20,
    }


def get_json(server: Any, path: str) -> Any:
    with urllib.request.urlopen(server.http + path, timeout=30) as answer:  # noqa: S310 - loopback
        return json.loads(answer.read())


def row_ids(w: Any) -> list[str]:
    return w.page.eval_on_selector_all(
        "#runs-body tr[data-run-id]:not([hidden])", "rows => rows.map(r => r.dataset.runId)"
    )


def test_runs_list_shows_start_duration_status_filters_and_archives(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    old = raw_trainer(server, "long_lstm")
    old.send([step_record(0)])
    new = raw_trainer(server, "long_lstm")  # the same name again: told apart by start time
    new.send([step_record(s) for s in range(3)])
    other = raw_trainer(server, "gru-baseline")
    other.send([step_record(0), end_record(0)])
    w = open_page(server)
    w.page.wait_for_selector(f"tr[data-run-id='{old.run_id}']")
    assert row_ids(w) == [other.run_id, new.run_id, old.run_id]  # newest first
    headers = w.page.eval_on_selector_all(".runs thead th", "ths => ths.map(t => t.textContent)")
    for name in ("name", "status", "started", "duration", "last step", "alerts"):
        assert name in headers, headers
    started = w.page.inner_text(f"tr[data-run-id='{new.run_id}'] [data-field=started]")
    summary = get_json(server, f"/api/runs/{new.run_id}")
    assert started == time.strftime("%Y-%m-%d %H:%M", time.localtime(summary["started"]))
    assert w.page.inner_text(f"tr[data-run-id='{new.run_id}'] [data-field=duration]").endswith(" s")
    assert w.page.inner_text(f"tr[data-run-id='{other.run_id}'] .badge") == "finished"
    w.page.fill("#runs-filter", "LSTM")
    wait_js(w.page, f"() => document.querySelector(\"tr[data-run-id='{other.run_id}']\").hidden")
    assert row_ids(w) == [new.run_id, old.run_id]
    w.page.fill("#runs-filter", "")
    # Archive the older twin: gone from the list, now and after a reload.
    w.page.click(f"tr[data-run-id='{old.run_id}'] button.archive")
    w.page.wait_for_selector(f"tr[data-run-id='{old.run_id}']", state="detached")
    assert "stays readable" in w.page.inner_text("#runs-message")
    w.page.reload()
    w.page.wait_for_selector(f"tr[data-run-id='{new.run_id}']")
    assert old.run_id not in row_ids(w)
    # ... and its data stays readable by id.
    w.page.goto(f"{server.http}/#/run/{old.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    assert w.page.inner_text("#run-name") == "long_lstm"
    assert w.page.inner_text("[data-stat=step]") == "0"
    assert_clean(w)


def test_view_token_cannot_archive_but_the_ingest_token_can(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server(token="ingest-secret", view_token="view-only")
    trainer = raw_trainer(server, "private", token="ingest-secret")
    trainer.send([step_record(0)])
    row = f"tr[data-run-id='{trainer.run_id}']"
    w = open_page(server, query="?token=view-only")
    w.page.wait_for_selector(row)
    w.page.click(f"{row} button.archive")
    wait_js(
        w.page, "() => document.getElementById('runs-message').textContent.includes('ingest token')"
    )
    assert w.page.is_visible(row)
    admin = open_page(server, query="?token=ingest-secret")
    admin.page.wait_for_selector(row)
    admin.page.click(f"{row} button.archive")
    admin.page.wait_for_selector(row, state="detached")
    w.page.reload()
    w.page.wait_for_selector("#runs-body .empty-row")
    # Chromium logs the refused PUT (401) as a console error; nothing else went wrong.
    assert all("401" in e for e in w.errors), w.errors
    assert_clean(admin)


def test_replay_header_epoch_stat_and_clock_are_right(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "finished-run")
    records: list[dict[str, Any]] = []
    for s in range(120):
        records.append(step_record(s))
        if s % 20 == 19:
            records.append(epoch_record(s // 20, s))
    trainer.send([*records, alert_record(60), end_record(119)])
    w = open_page(server, f"#/replay/{trainer.run_id}")
    w.page.wait_for_selector("#replay-speed")
    # The server is up: the header says so although a replay opens no live socket.
    wait_js(w.page, "() => document.getElementById('conn').textContent === 'server up'")
    assert "on" in w.page.get_attribute("#conn", "class")
    # Normal speed is 20 s for the whole replay; switched to 5 s, what is left takes
    # its share of 5 s of page clock, not less.
    mark = """() => { const v = window.gradwatch.state.view;
        window.replayMark = { t0: performance.now(), left: 1 - v.pos / v.items.length }; }"""
    w.page.select_option("#replay-speed", "5")
    w.page.evaluate(mark)
    w.page.evaluate("""() => new Promise((done) => { const poll = () => {
        const v = window.gradwatch.state.view;
        if (v.pos >= v.items.length) { window.replayMark.t1 = performance.now(); done(); }
        else setTimeout(poll, 20); }; poll(); })""")
    took = w.page.evaluate(
        "() => [(window.replayMark.t1 - window.replayMark.t0) / 1000, window.replayMark.left]"
    )
    assert took[1] > 0.5, took  # most of the replay was still to come
    assert took[0] >= 0.9 * 5 * took[1], took
    wait_js(
        w.page,
        "() => document.getElementById('replay-label').textContent.startsWith('replayed all')",
    )
    # The last steps (100-119) are in epoch 5, as the live step records said.
    assert w.page.inner_text("[data-stat=epoch]") == "5"
    assert w.page.inner_text("[data-stat=step]") == "119"
    assert w.page.inner_text("#conn") == "server up"
    assert_clean(w)
