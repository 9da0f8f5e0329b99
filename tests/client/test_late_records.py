"""A live record for a step before the last one drawn (a late batch) is drawn at its
step, and a record for a step drawn already (sent twice) is not drawn again: in every
chart of the run view (the gradient-flow heatmap too) and the compare view, and in the
overhead stat's window.

The charts used to drop any point at or before the last step drawn: under the default
budget 7-20 % of a run's steps went missing from the live charts, and the overhead
stat named a window of the steps that happened to come in order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import assert_clean, chart, scroll_to, step_record, wait_js

pytestmark = pytest.mark.browser

FIRST = range(6)  # in history when the page opens
AHEAD = (8, 9)  # live, drawn before...
LATE = (6, 7)  # ...these come
AGAIN = (4, 9)  # sent twice
LAST = 10


def record(step: int) -> dict[str, Any]:
    rec = step_record(step, nonfinite=step == 6)
    # each step its own share, the late ones far from the others: a step left out or
    # counted twice moves the weighted share
    rec["overhead"] = 0.5 if step in LATE else 0.01 * (step + 1)
    return rec


def weighted_share(steps: range) -> str:
    recs = [record(s) for s in steps]
    share = sum(r["overhead"] * r["duration_s"] for r in recs) / sum(r["duration_s"] for r in recs)
    return f"{share * 100:.1f} %"


def trace(page: Any, chart_id: str, name: str) -> list[Any]:
    """The x values of the trace called `name` in a chart."""
    return chart(page, chart_id, f"d.data.find((t) => t.name === {json.dumps(name)}).x")


def wait_last_x(page: Any, chart_id: str, name: str, step: int) -> None:
    find = f"document.getElementById({json.dumps(chart_id)}).data"
    wait_js(page, f"""() => {{ const t = ({find} || []).find((t) => t.name === {json.dumps(name)});
        return !!t && t.x[t.x.length - 1] === {step}; }}""")


def send_late_and_again(trainer: Any, page: Any, chart_id: str, name: str) -> None:
    """Steps 8 and 9 drawn live, then 6 and 7, then 4 and 9 again, then the last step."""
    trainer.send([record(s) for s in AHEAD])
    wait_last_x(page, chart_id, name, AHEAD[-1])
    trainer.send([record(s) for s in LATE])
    trainer.send([record(s) for s in AGAIN])
    trainer.send([record(LAST)])
    wait_last_x(page, chart_id, name, LAST)


def test_run_view_draws_a_late_step_at_its_place_and_a_repeated_one_once(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "late-records", config={})  # the default budget
    trainer.send([record(s) for s in FIRST])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1'][data-scalars='1']")
    scroll_to(w.page, "chart-loss")
    send_late_and_again(trainer, w.page, "chart-loss", "loss")
    every = list(range(LAST + 1))
    wait_js(w.page, f"() => document.querySelector('[data-stat=step]').textContent === '{LAST}'")
    assert trace(w.page, "chart-loss", "loss") == every
    for chart_id, name in [("chart-time", "step time"), ("chart-time", "trend (rolling median)"),
                           ("chart-graph", "autograd graph nodes"), ("chart-graph", "process RSS"),
                           ("chart-norms", "total norm"), ("chart-norms", "lstm.weight_hh_l0"),
                           ("chart-gates", "lstm.weight_hh_l0 [f]")]:  # fmt: skip
        scroll_to(w.page, chart_id)
        wait_last_x(w.page, chart_id, name, LAST)
        assert trace(w.page, chart_id, name) == every, (chart_id, name)
    assert trace(w.page, "chart-norms", "non-finite") == [6]  # the late step's marker
    # the gradient-flow heatmap: a row per step, the late ones in their place
    heat = "chart-heatmap-lstm-input"
    scroll_to(w.page, heat)
    wait_js(w.page, f"""() => {{ const d = document.getElementById('{heat}').data;
        return !!d && d[0].y[d[0].y.length - 1] === {LAST}; }}""")
    assert chart(w.page, heat, "Array.from(d.data[0].y)") == every
    assert chart(w.page, heat, "Array.from(d.data[1].y)") == every  # the horizon line
    assert chart(w.page, heat, "d.data[0].z.length") == len(every)
    overhead = w.page.locator("[data-stat='gradwatch overhead']")
    assert overhead.inner_text() == weighted_share(range(LAST + 1))
    assert f"steps 0-{LAST}," in overhead.get_attribute("title")
    assert_clean(w)


def test_compare_view_draws_a_late_step_at_its_place_and_a_repeated_one_once(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    a = raw_trainer(server, "run-a")
    b = raw_trainer(server, "run-b")
    a.send([record(s) for s in range(LAST + 1)])
    b.send([record(s) for s in FIRST])
    w = open_page(server, f"#/compare/{a.run_id}/{b.run_id}")
    wait_js(w.page, "() => !!document.getElementById('chart-cmp-loss')?.data")
    send_late_and_again(b, w.page, "chart-cmp-loss", "run-b")
    every = list(range(LAST + 1))
    for field in ("loss", "duration_s", "graph_nodes", "total_norm"):
        wait_last_x(w.page, f"chart-cmp-{field}", "run-b", LAST)
        assert trace(w.page, f"chart-cmp-{field}", "run-b") == every, field
    assert_clean(w)


def test_overhead_window_takes_history_that_comes_after_the_first_live_steps(
    gradwatch_server, open_page
):
    """The run view asks for the overhead window's history while live records already
    come: the window holds both, in step order, whichever came first."""
    server = gradwatch_server()
    w = open_page(server)
    w.page.wait_for_selector("body[data-painted='1']")
    got = w.page.evaluate("""async () => {
        const { OverheadShare } = await import("/static/js/overhead.js");
        const share = new OverheadShare(500);
        for (let s = 300; s < 310; s++) share.push(s, 0.02, 0.01);
        const steps = [...Array(300).keys()];
        share.fromHistory({ overhead: { step: steps, value: steps.map(() => 0.01) },
                            duration_s: { step: steps, value: steps.map(() => 0.01) } });
        share.push(305, 0.9, 0.01);  // sent twice: counted once, as first given
        return share.share();
    }""")
    assert (got["first"], got["last"], got["steps"]) == (0, 309, 310)
    assert got["share"] == pytest.approx((300 * 0.01 + 10 * 0.02) / 310)
    assert_clean(w)


def test_compare_views_profile_stays_on_the_latest_step_when_a_late_step_comes(
    gradwatch_server, open_page, raw_trainer
):
    """The compare view's profile chart shows each run's latest step: a late record
    draws its heatmap row and leaves the profile as it was."""
    server = gradwatch_server()
    a = raw_trainer(server, "run-a")
    b = raw_trainer(server, "run-b")

    def scaled(step: int) -> dict[str, Any]:
        rec = step_record(step, timesteps=12)
        rec["timesteps"]["lstm"]["input"] = [(step + 1) * 0.01 * (t + 1) for t in range(12)]
        return rec

    a.send([scaled(s) for s in FIRST])
    b.send([scaled(s) for s in FIRST])
    w = open_page(server, f"#/compare/{a.run_id}/{b.run_id}")
    wait_js(w.page, "() => document.body.dataset.painted === '1'")
    heat = "chart-cmp-heat-B"
    rows = f"() => Array.from(document.getElementById('{heat}').data[0].y)"
    b.send([scaled(s) for s in AHEAD])
    wait_js(w.page, f"() => ({rows})().includes({AHEAD[-1]})")
    b.send([scaled(s) for s in LATE])
    wait_js(w.page, f"() => ({rows})().includes({LATE[-1]})")
    assert w.page.evaluate(rows) == list(range(AHEAD[-1] + 1))
    profile = w.page.evaluate(
        "() => document.getElementById('chart-cmp-profile').data"
        ".find((t) => t.name === 'run-b · lstm').y")
    assert list(profile) == pytest.approx(scaled(AHEAD[-1])["timesteps"]["lstm"]["input"])
    assert_clean(w)
