"""The dashboard in a real headless Chromium against a real gradwatch server.

Records come from a trainer-like websocket client speaking protocol v1 (or, in
test_real_training.py, from a real training run through watch()). Every test checks
that the console stayed clean and that no request left the server's origin.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from gradwatch.protocol.codec import packed_series
from gradwatch.server.report_charts import horizon

from .conftest import (
    alert_record,
    assert_clean,
    chart,
    end_record,
    scroll_to,
    step_record,
    vanishing_profile,
    wait_js,
    wait_points,
)

pytestmark = pytest.mark.browser

HOSTILE = "<script>alert(1)</script>"


def test_runs_list_updates_live_with_status_last_step_and_alerts(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    first = raw_trainer(server, "first-run")
    first.send([step_record(0)])
    w = open_page(server)
    row = f"tr[data-run-id='{first.run_id}']"
    w.page.wait_for_selector(row)
    assert w.page.inner_text(f"{row} a.run-link") == "first-run"

    second = raw_trainer(server, "second-run")  # created while the page is open
    second.send([step_record(s) for s in range(5)] + [alert_record(3)])
    row2 = f"tr[data-run-id='{second.run_id}']"
    w.page.wait_for_selector(row2)
    wait_js(w.page, f"""() => {{
        const r = document.querySelector("{row2}");
        const alerts = r && r.querySelector(".count-alerts");
        return r && r.querySelector("[data-field=last_step]").textContent === "4"
            && alerts && alerts.textContent === "1";
    }}""")
    first.send([step_record(1), end_record(1)])
    w.page.wait_for_selector(f"{row} .badge[data-status=finished]")
    # Newest first: the second run sits above the first.
    ids = w.page.eval_on_selector_all("#runs-body tr", "rows => rows.map(r => r.dataset.runId)")
    assert ids.index(second.run_id) < ids.index(first.run_id)
    w.screenshot("runs-list")
    assert_clean(w)


def test_run_named_script_tag_shows_as_text_everywhere(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, HOSTILE)
    trainer.send([step_record(s) for s in range(3)] + [alert_record(1, subject=HOSTILE)])
    w = open_page(server)
    dialogs: list[str] = []
    w.page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    w.page.wait_for_selector("#runs-body a.run-link")
    assert w.page.inner_text("#runs-body a.run-link") == HOSTILE
    w.page.click("#runs-body a.run-link")
    w.page.wait_for_selector("body[data-painted='1'] #run-name")
    assert w.page.inner_text("#run-name") == HOSTILE
    assert HOSTILE in w.page.inner_text("#crumbs")
    assert HOSTILE in w.page.inner_text("#alerts-list")
    # Nothing the trainer named became an element.
    scripts = "() => document.querySelectorAll('main script, header script').length"
    assert w.page.evaluate(scripts) == 0
    assert dialogs == []
    w.screenshot("hostile-name")
    assert_clean(w)


# U+202E turns the rest of a name around; ESC starts a terminal escape; BEL rings.
BIDI = "run\u202egnp.exe \x1b[31mred\x07"
BIDI_SHOWN = "run[U+202E]gnp.exe [U+001B][31mred[U+0007]"
INVISIBLE = "\u202e\x1b\x07"


def test_bidi_and_control_characters_in_names_are_shown_neutralised_everywhere(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, BIDI)
    param = "lstm.\u202eweight_hh"
    records = [{**step_record(s), "param_norms": {param: 0.3, "head.weight": 0.2}}
               for s in range(3)]
    trainer.send([*records, alert_record(1, subject=BIDI)])
    w = open_page(server)
    w.page.wait_for_selector("#runs-body a.run-link")
    assert w.page.inner_text("#runs-body a.run-link") == BIDI_SHOWN
    w.page.click("#runs-body a.run-link")
    w.page.wait_for_selector("body[data-painted='1'] #run-name")
    assert w.page.inner_text("#run-name") == BIDI_SHOWN
    assert BIDI_SHOWN in w.page.inner_text("#crumbs")
    assert BIDI_SHOWN in w.page.inner_text("#alerts-list")
    scroll_to(w.page, "chart-norms")
    legends = chart(w.page, "chart-norms", "d.data.map(t => String(t.name))")
    assert any("lstm.[U+202E]weight_hh" in n for n in legends), legends
    # Nothing shown anywhere (text, chart labels, the tab's title) holds the controls.
    shown = w.page.evaluate("() => document.body.innerText + document.title + "
                            "[...document.querySelectorAll('[title], [aria-label]')]"
                            ".map(e => e.title + e.getAttribute('aria-label')).join() + "
                            "[...document.querySelectorAll('.js-plotly-plot')]"
                            ".map(d => JSON.stringify(d.data.map(t => [t.name, t.legendgroup])"
                            " ) + JSON.stringify(d.layout.title || '')).join()")
    assert not any(c in shown for c in INVISIBLE), [c for c in INVISIBLE if c in shown]
    # The stored name stays as sent.
    with urllib.request.urlopen(f"{server.http}/api/runs", timeout=30) as answer:  # noqa: S310
        (run,) = json.loads(answer.read())
    assert run["name"] == BIDI
    assert_clean(w)


def test_heatmap_gains_rows_and_profile_and_timing_have_points_while_a_run_streams(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "streaming")
    trainer.send([step_record(s) for s in range(10)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    heat = "chart-heatmap-lstm-input"
    assert chart(w.page, heat, "d.data[0].z.length") == 10
    for start in (10, 15, 20):  # live batches while the page is open
        trainer.send([step_record(s) for s in range(start, start + 5)])
    wait_js(w.page, f"() => document.getElementById('{heat}').data[0].z.length === 25")
    assert chart(w.page, heat, "d.data[0].y.slice(-3)") == [22, 23, 24]
    assert chart(w.page, heat, "d.data[0].z[24].length") == 121
    # Relative to each step's peak by default: the range fits the 13 decades the
    # vanishing profile spans, and the colour bar says what the colours mean.
    assert chart(w.page, heat, "[d.data[0].zmin, d.data[0].zmax]") == [-13, 0]
    assert "peak" in chart(w.page, heat, "d.data[0].colorbar.title.text")
    # Latest profile: 121 points, the latest step's values.
    assert chart(w.page, "chart-profile", "d.data[0].y.length") == 121
    # The step-time chart is below the fold: drawn in idle time or when scrolled to,
    # with its history and every live point since.
    scroll_to(w.page, "chart-time")
    wait_points(w.page, "chart-time", 25)
    assert chart(w.page, "chart-time", "d.layout.yaxis.title.text") == "step time (ms)"
    scroll_to(w.page, "chart-norms")
    assert chart(w.page, "chart-norms", "d.data.map(t => t.name)")[0] == "total norm"
    stats = w.page.evaluate("() => window.gradwatch.stats")
    # Appended, not redrawn: extendTraces ran, batched per frame (never more frames than records).
    assert stats["extendCalls"] > 0
    assert stats["flushes"] <= stats["records"] == 15
    titles = "ds => ds.filter(d => d.layout).map(d => [d.id, d.layout.xaxis.title.text])"
    for chart_id, title in w.page.eval_on_selector_all(".chart:not([hidden])", titles):
        assert title, f"{chart_id} has no x axis title"
    w.screenshot("run-view-streaming")
    assert_clean(w)


def test_nonfinite_steps_are_marked_on_the_norm_chart_from_history_and_live(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "nan-run")
    trainer.send([step_record(s, nonfinite=s == 4) for s in range(8)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    scroll_to(w.page, "chart-norms")
    marks = "d.data.filter(t => t.name === 'non-finite').flatMap(t => Array.from(t.x))"
    assert chart(w.page, "chart-norms", marks) == [4]
    trainer.send([step_record(8), step_record(9, nonfinite=True)])
    wait_js(w.page, """() => document.getElementById('chart-norms').data
        .filter(t => t.name === 'non-finite').flatMap(t => Array.from(t.x)).includes(9)""")
    assert chart(w.page, "chart-norms", marks) == [4, 9]
    assert_clean(w)


def test_alert_shows_message_evidence_fix_and_links_to_its_step(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "alerting")
    trainer.send([step_record(s) for s in range(6)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    assert "No alerts" in w.page.inner_text("#alerts-list")
    trainer.send([step_record(6), alert_record(6)])  # arrives live
    w.page.wait_for_selector("#alerts-list article.alert[data-code=vanishing]")
    text = w.page.inner_text("#alerts-list article.alert")
    assert "gradient reaches back only 20 of 121 timesteps" in text
    assert "truncated BPTT" in w.page.inner_text("#alerts-list .fix")
    assert "suggested_truncation" in text
    # The profile's line is the drawn profile's own horizon (93), not the alert's (101).
    lines = "d.data.filter(t => t.name.startsWith('horizon')).map(t => t.x[0])"
    assert chart(w.page, "chart-profile", lines) == [horizon(vanishing_profile())]
    w.page.click("#alerts-list button.goto")
    panel = "#panel-heatmap-lstm-input"
    w.page.wait_for_selector(f"{panel}[data-marked='6']")
    assert chart(w.page, "chart-heatmap-lstm-input", "d.layout.shapes[0].y0") == 6
    assert_clean(w)


def test_compare_overlays_two_runs_and_appends_live(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    bug = raw_trainer(server, "long-lstm")
    fixed = raw_trainer(server, "long-lstm --fixed")
    bug.send([step_record(s) for s in range(12)])
    fixed.send([step_record(s, timesteps=60) for s in range(12)])
    w = open_page(server)
    w.page.wait_for_selector(f"tr[data-run-id='{fixed.run_id}']")
    w.page.check(f"tr[data-run-id='{bug.run_id}'] input[type=checkbox]")
    w.page.check(f"tr[data-run-id='{fixed.run_id}'] input[type=checkbox]")
    w.page.click("#compare-button")
    w.page.wait_for_selector("body[data-painted='1'] #cmp-name-a")
    names = chart(w.page, "chart-cmp-loss", "d.data.map(t => t.name).sort()")
    assert names == ["long-lstm", "long-lstm --fixed"]
    profiles = "d.data.filter(t => t.mode === 'lines+markers').length"
    assert chart(w.page, "chart-cmp-profile", profiles) == 2
    fixed.send([step_record(12, timesteps=60)])
    wait_js(w.page, """() => document.getElementById('chart-cmp-loss').data
        .some(t => t.name === 'long-lstm --fixed' && t.x.length === 13)""")
    w.screenshot("compare")
    assert_clean(w)


def test_compare_shows_the_module_picked_for_each_run(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    bug = raw_trainer(server, "two-layer")
    fixed = raw_trainer(server, "two-layer --fixed")

    def two_modules(s: int, length: int) -> dict[str, Any]:
        rec = step_record(s, timesteps=length)
        # A second recurrent module, 7 timesteps long, and packed as the sender sends it.
        rec["timesteps"]["decoder"] = {"hidden": packed_series([0.5] * 7)}
        return rec

    bug.send([two_modules(s, 121) for s in range(10)])
    fixed.send([step_record(s, timesteps=60) for s in range(10)])
    w = open_page(server, f"#/compare/{bug.run_id}/{fixed.run_id}")
    w.page.wait_for_selector("body[data-painted='1'] #cmp-heat-select-A")
    assert w.page.locator("#cmp-heat-select-B").count() == 0  # one module: nothing to pick
    options = w.page.eval_on_selector_all("#cmp-heat-select-A option", "os => os.map(o => o.text)")
    assert options == ["lstm", "decoder · hidden"]
    w.page.select_option("#cmp-heat-select-A", "1")
    w.page.wait_for_selector("#panel-cmp-heat-A[data-module='decoder'][data-rows='10']")
    assert w.page.inner_text("#panel-cmp-heat-A h2") == "two-layer: decoder · hidden"
    assert chart(w.page, "chart-cmp-heat-A", "d.data[0].z[0].length") == 7
    # Live rows now go to the module picked.
    bug.send([two_modules(10, 121)])
    wait_js(w.page, """() => document.getElementById('chart-cmp-heat-A').data[0].z.length === 11""")
    assert_clean(w)


def test_replay_draws_a_finished_run_from_history(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "finished-run")
    trainer.send([step_record(s) for s in range(40)] + [alert_record(20), end_record(39)])
    w = open_page(server, f"#/replay/{trainer.run_id}")
    w.page.wait_for_selector("#replay-label")
    label = "document.getElementById('replay-label').textContent"
    wait_js(w.page, f"() => {label}.startsWith('replayed all')")
    assert chart(w.page, "chart-heatmap-lstm-input", "d.data[0].z.length") == 40
    scroll_to(w.page, "chart-time")
    wait_points(w.page, "chart-time", 40)
    w.page.locator("#replay-position").scroll_into_view_if_needed()
    w.page.wait_for_selector("#alerts-list article.alert[data-code=vanishing]")
    # Seek back to the start: the charts are drawn again from nothing.
    w.page.eval_on_selector(
        "#replay-position", "e => { e.value = '5'; e.dispatchEvent(new Event('change')); }"
    )
    wait_js(w.page, """() => {
        const d = document.getElementById('chart-heatmap-lstm-input');
        return d && d.data && d.data[0].z && d.data[0].z.length === 5;
    }""")
    assert_clean(w)


def test_theme_toggle_switches_dark_and_recolours_charts(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "themed")
    trainer.send([step_record(s) for s in range(5)])
    w = open_page(server, f"#/run/{trainer.run_id}", color_scheme="light")
    w.page.wait_for_selector("body[data-painted='1']")
    scroll_to(w.page, "chart-loss")
    light = chart(w.page, "chart-loss", "d.layout.font.color")
    w.page.click("#theme-toggle")
    assert w.page.evaluate("() => document.documentElement.dataset.theme") == "dark"
    wait_js(w.page, f"() => document.getElementById('chart-loss').layout.font.color !== {light!r}")
    dark = chart(w.page, "chart-loss", "d.layout.font.color")
    assert dark.lower() != light.lower()
    w.screenshot("run-view-dark")
    assert_clean(w)


def test_view_token_leaves_the_address_and_rides_in_a_header_and_a_cookie(
    gradwatch_server, open_page, raw_trainer
):
    # the access log on: it shows every request's path
    server = gradwatch_server(token="ingest-secret", view_token="view-only",
                              args=("--log-level", "info"))
    trainer = raw_trainer(server, "private", token="ingest-secret")
    trainer.send([step_record(s) for s in range(3)])
    w = open_page(server, f"#/run/{trainer.run_id}", query="?token=view-only")
    w.page.wait_for_selector("body[data-painted='1']")
    # The shared link's token left the address at once; the route stayed.
    assert w.page.evaluate("() => window.location.search") == ""
    assert w.page.evaluate("() => window.location.hash") == f"#/run/{trainer.run_id}"
    # No request after the page itself carries the token in its URL...
    data = [u for u in w.requests if "/api/" in u or "/ws/" in u]
    assert any("/ws/live" in u for u in data) and any("/api/runs/" in u for u in data), data
    assert not [u for u in w.requests[1:] if "token" in u], w.requests
    # ...REST sends it as a header, the websocket as the HttpOnly cookie
    rest = [(u, a) for u, a in w.authorization if "/api/" in u]
    assert rest and all(a == "Bearer view-only" for _, a in rest), rest
    (cookie,) = [c for c in w.page.context.cookies() if c["name"].startswith("gradwatch_token")]
    assert cookie["name"] == f"gradwatch_token_{server.port}" and cookie["value"] == "view-only"
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert w.page.evaluate("() => document.cookie") == ""  # scripts cannot read it
    # The live socket, with no token in its URL, brings a new step.
    trainer.send([step_record(3)])
    scroll_to(w.page, "chart-loss")
    wait_points(w.page, "chart-loss", 4)
    # A reload of the stripped address still shows the run (cookie and this tab's token).
    w.page.reload()
    w.page.wait_for_selector("body[data-painted='1']")
    assert w.page.evaluate("() => window.location.search") == ""
    # Only the shared link itself carried the token (and the log redacts it there).
    log = server.log_path.read_text()
    assert "GET /api/runs/" in log and "/ws/live" in log, log[-2000:]
    assert "view-only" not in log
    viewer = [line for line in log.splitlines()
              if any(p in line for p in ('"GET /', "WebSocket /ws/live"))]
    shared_link = [line for line in viewer if '"GET /?token=<redacted> HTTP' in line]
    assert len(shared_link) == 1, log[-2000:]
    assert [line for line in viewer if "token=" in line] == shared_link, log[-2000:]
    assert_clean(w)


def test_a_page_without_the_token_gets_401_and_a_wrong_cookie_reads_nothing(
    gradwatch_server, open_page
):
    server = gradwatch_server(token="ingest-secret", view_token="view-only")
    w = open_page(server, "#/", query="")
    assert "needs the link with its ?token=" in w.page.inner_text("body")
    w.page.context.add_cookies([{"name": f"gradwatch_token_{server.port}", "value": "guess",
                                 "url": server.http}])
    w.page.goto(f"{server.http}/#/")
    assert "needs the link with its ?token=" in w.page.inner_text("body")


def test_unknown_run_shows_the_servers_answer_instead_of_breaking(gradwatch_server, open_page):
    server = gradwatch_server()
    w = open_page(server, "#/run/no-such-run")
    w.page.wait_for_selector("main .error-box")
    text = w.page.inner_text("main .error-box")
    assert "/api/runs/no-such-run: 404" in text
    # The only console error is Chromium's own line about the 404 answer.
    assert all("404" in e for e in w.errors), w.errors
    w.page.click("main a")  # "Back to the runs"
    w.page.wait_for_selector("#runs-body")
    assert w.foreign_requests() == []
