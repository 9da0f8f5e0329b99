"""A dashboard left open is cheap (issue #15) without losing truth: the runs list
rewrites a streaming run's cells in place (the row, and its first-seen highlight, are
not rebuilt per summary), and the latest-profile chart, not redrawn while off screen,
shows the latest step's values as soon as it scrolls into view.
"""

from __future__ import annotations

import pytest

from .conftest import chart, scroll_to, step_record, vanishing_profile, wait_js

pytestmark = pytest.mark.browser


def test_the_runs_list_rewrites_a_streaming_runs_cells_in_place(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "streaming")
    trainer.send([step_record(0)])
    w = open_page(server)
    row = f"tr[data-run-id='{trainer.run_id}']"
    w.page.wait_for_selector(row)
    w.page.eval_on_selector(row, "r => { r.dataset.seen = 'first'; }")
    assert "fresh" not in (w.page.get_attribute(row, "class") or "")  # listed at load
    for step in range(1, 13):
        trainer.send([step_record(step)])
    wait_js(
        w.page,
        f"""() => document.querySelector("{row} [data-field=last_step]")
        .textContent === "12" """,
    )
    # the same element, never re-created, never re-highlighted
    assert w.page.get_attribute(row, "data-seen") == "first"
    assert "fresh" not in (w.page.get_attribute(row, "class") or "")
    assert w.page.inner_text(f"{row} .badge") == "live"

    other = raw_trainer(server, "second")  # first seen live: highlighted once
    other.send([step_record(0)])
    w.page.wait_for_selector(f"tr.fresh[data-run-id='{other.run_id}']")
    assert w.errors == [], w.errors


def test_an_off_screen_profile_shows_the_latest_step_when_scrolled_to(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "profile")
    trainer.send([step_record(s) for s in range(3)])
    # a short window: the heatmap fills the screen and the profile lies below it
    w = open_page(server, f"#/run/{trainer.run_id}", viewport={"width": 900, "height": 500})
    w.page.wait_for_selector("body[data-painted='1']")
    w.page.evaluate("() => window.scrollTo(0, 0)")
    wait_js(w.page, "() => !window.gradwatch.state.view.profile.view.visible")
    last = step_record(40)
    last["timesteps"]["lstm"]["input"] = vanishing_profile(121, 0.9)
    for step in range(3, 40):
        trainer.send([step_record(step)])
    trainer.send([last])
    heat = "chart-heatmap-lstm-input"
    wait_js(w.page, f"() => document.getElementById('{heat}').data[0].z.length === 41")
    scroll_to(w.page, "chart-profile")
    want = vanishing_profile(121, 0.9)
    wait_js(
        w.page,
        f"""() => {{
        const y = document.getElementById("chart-profile").data[0].y;
        return Math.abs(y[0] - {want[0]}) < 1e-12 * {want[0]};
    }}""",
    )
    got = chart(w.page, "chart-profile", "Array.from(d.data[0].y)")
    assert got == pytest.approx(want, rel=1e-12)
    assert w.errors == [], w.errors
