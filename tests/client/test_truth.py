"""The dashboard shows what is true now, at a glance (issue 16), in real Chromium
against a real server fed over the ingest websocket: heatmap colours fit the data,
live numbers follow live records, print and off-screen charts show every point, the
dark theme reaches every chart, new modules get their heatmap, empty panels say how
to fill them."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from typing import Any

import pytest

from .conftest import (
    alert_record,
    assert_clean,
    chart,
    scroll_to,
    step_record,
    vanishing_profile,
    wait_js,
    wait_points,
)

pytestmark = pytest.mark.browser
HEAT = "chart-heatmap-lstm-input"


def with_profile(step: int, profile: list[float], module: str = "lstm") -> dict[str, Any]:
    rec = step_record(step)
    rec["timesteps"] = {module: {"input": profile}}
    return rec


def light_step(step: int, duration_s: float = 0.01) -> dict[str, Any]:
    """A step record with scalars only (cheap to send by the thousand)."""
    return {"kind": "step", "step": step, "t": time.time(), "duration_s": duration_s,
            "loss": 1.0 / (1 + step), "total_norm": 0.5}  # fmt: skip


def get_json(server: Any, path: str) -> Any:
    with urllib.request.urlopen(server.http + path, timeout=30) as answer:  # noqa: S310 - loopback
        return json.loads(answer.read())


def horizon(values: list[float]) -> int:
    top = max(values)
    return next(t for t, v in enumerate(values) if v >= top * 1e-3)


@pytest.mark.parametrize(
    ("profile", "relative", "absolute"),
    [
        (vanishing_profile(121), [-13, 0], [-14, 0]),  # 0.5 * 0.78**t: 13 decades
        ([2.0e-4 * (1 + 0.01 * t) for t in range(40)], [-6, 0], [-4, -3]),  # healthy, tiny norms
        ([10.0 ** (-20 + t / 3) for t in range(61)], [-20, 0], [-20, 0]),  # 20 decades
    ],
)
def test_heatmap_colour_range_fits_the_data_and_draws_the_horizon(
    gradwatch_server, open_page, raw_trainer, profile, relative, absolute
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "heat")
    trainer.send([with_profile(s, profile) for s in range(6)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    assert chart(w.page, HEAT, "[d.data[0].zmin, d.data[0].zmax]") == relative
    # Relative: the peak timestep is 0 decades, the rest log10(v / peak).
    row = chart(w.page, HEAT, "d.data[0].z[5]")
    assert row == pytest.approx([math.log10(v / max(profile)) for v in profile], abs=1e-9)
    # The vanishing horizon is a line over the heatmap: one point per step.
    assert chart(w.page, HEAT, "d.data[1].x") == [horizon(profile)] * 6
    trainer.send([with_profile(s, profile) for s in range(6, 9)])  # live rows extend both
    wait_js(w.page, f"() => document.getElementById('{HEAT}').data[1].x.length === 9")
    w.page.select_option("#heat-scale", "absolute")
    wait_js(w.page, f"() => document.getElementById('{HEAT}').data[0].zmax === {absolute[1]}")
    assert chart(w.page, HEAT, "[d.data[0].zmin, d.data[0].zmax]") == absolute
    assert chart(w.page, HEAT, "d.data[0].z[8][0]") == pytest.approx(math.log10(profile[0]))
    assert chart(w.page, HEAT, "d.data[0].z.length") == 9
    assert_clean(w)


def test_header_alert_count_and_trend_note_follow_live_updates(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "live-numbers")
    # A slow first step (warm-up) and then flat: no trend to speak of.
    trainer.send(
        [light_step(0, 2.0)] + [light_step(s, 0.010) for s in range(1, 80)] + [alert_record(5)]
    )
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-scalars='1']")
    note = "document.getElementById('panel-time').querySelector('header .note')"
    flat = w.page.evaluate(f"() => {note}.textContent")
    assert "per 100 steps (steps 24–79)" in flat, flat
    assert abs(float(flat.split()[1].replace("−", "-"))) < 0.5, flat  # µs, not +467 ms
    assert "1 alerts" in w.page.inner_text("p.sub")
    # Live: step time now grows 1 ms per step, and more alerts fire.
    trainer.send([light_step(s, 0.010 + 0.001 * (s - 80)) for s in range(80, 200)])
    trainer.send(
        [alert_record(s) for s in (150, 160, 170)] + [alert_record(180, "slowdown", "step")]
    )
    wait_js(w.page, f"() => {note}.dataset.step === '199'")
    grown = w.page.evaluate(f"() => {note}.textContent")
    assert grown.startswith("trend +") and "ms per 100 steps" in grown, grown
    assert 50 < float(grown.split()[1].lstrip("+")) <= 100, grown  # ~100 ms per 100 steps
    api_count = get_json(server, f"/api/runs/{trainer.run_id}")["alerts"]
    assert api_count == 5
    wait_js(w.page, "() => document.querySelector('p.sub').textContent.includes('5 alerts')")
    assert_clean(w)


def test_print_media_draws_every_chart_with_data(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "printed")
    trainer.send([step_record(s) for s in range(30)] + [{"kind": "epoch", "epoch": 0, "step": 29,
                  "t": time.time(), "duration_s": 1.5, "steps": 30}])  # fmt: skip
    w = open_page(server, f"#/run/{trainer.run_id}", viewport={"width": 1000, "height": 500})
    w.page.wait_for_selector("body[data-painted='1']")
    w.page.emulate_media(media="print")
    drawn = """() => [...document.querySelectorAll('.chart:not([hidden])')]
        .every(d => d.data && d.data.length)"""
    wait_js(w.page, drawn)
    for kind in ("loss", "time", "epochs", "graph", "norms", "gates"):
        assert chart(w.page, f"chart-{kind}", "d.data.length") > 0, kind
    assert chart(w.page, "chart-time", "d.data[0].x.length") == 30
    pdf = w.page.pdf()
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000
    assert_clean(w)


def test_chart_off_screen_for_long_shows_every_point(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "long-off-screen")
    trainer.send([light_step(s) for s in range(50)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-scalars='1']")
    for start in range(50, 3050, 500):  # 3000 live steps: 6000 points, past the backlog bound
        trainer.send([light_step(s) for s in range(start, start + 500)])
    wait_js(w.page, "() => document.querySelector('[data-stat=step]').textContent === '3,049'")
    scroll_to(w.page, "chart-time")
    wait_points(w.page, "chart-time", 3050)
    steps = chart(w.page, "chart-time", "d.data[0].x")
    assert steps == list(range(3050))  # history then live, no gap, no duplicate
    assert_clean(w)


def test_dark_toggle_restyles_every_chart_also_those_drawn_later(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "dark")
    trainer.send([step_record(s) for s in range(5)])
    w = open_page(server, f"#/run/{trainer.run_id}", color_scheme="light")
    w.page.wait_for_selector("body[data-painted='1']")
    w.page.click("#theme-toggle")
    # Drawn after the toggle: a module seen for the first time, and charts below.
    trainer.send([with_profile(5, [1.0] * 30, module="decoder")])
    w.page.wait_for_selector("#chart-heatmap-decoder-input .main-svg")
    w.page.emulate_media(media="print")  # and every other chart
    grids = """() => [...document.querySelectorAll('.chart')].filter(d => d.layout)
        .map(d => [d.id, d.layout.xaxis.gridcolor, d.layout.font.color])"""
    wait_js(
        w.page, "() => [...document.querySelectorAll('.chart:not([hidden])')].every(d => d.layout)"
    )
    found = w.page.evaluate(grids)
    assert len(found) >= 8, found
    for chart_id, grid, font in found:
        assert (grid.lower(), font.lower()) == ("#262c37", "#e6e9ef"), chart_id
    assert_clean(w)


def test_module_first_seen_live_gets_its_heatmap_without_reload(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "new-module")
    trainer.send([step_record(s) for s in range(3)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    assert w.page.query_selector("#chart-heatmap-decoder-input") is None
    trainer.send([with_profile(s, vanishing_profile(40), module="decoder") for s in range(3, 7)])
    wait_js(
        w.page,
        """() => { const d = document.getElementById('chart-heatmap-decoder-input');
        return d && d.data && d.data[0].z.length === 4; }""",
    )
    assert "decoder" in w.page.inner_text("#panel-heatmap-decoder-input h2")
    assert chart(w.page, "chart-heatmap-decoder-input", "d.data[0].y") == [3, 4, 5, 6]
    assert_clean(w)


def test_panels_this_run_will_never_fill_say_how_to_fill_them(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "no-profile")
    trainer.send([light_step(s) for s in range(5)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-scalars='1']")
    assert "profile=True" in w.page.inner_text("#panel-modules .nodata")
    assert "nn.LSTM" in w.page.inner_text("#panel-gates .nodata")
    assert w.page.is_hidden("#chart-modules")
    assert w.page.is_visible("#chart-time")
    assert_clean(w)


def test_compare_heatmaps_share_one_colour_range(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    bug, fixed = raw_trainer(server, "long-lstm"), raw_trainer(server, "long-lstm --fixed")
    bug.send([with_profile(s, vanishing_profile(121)) for s in range(5)])
    fixed.send([with_profile(s, [1.0 + 0.01 * t for t in range(121)]) for s in range(5)])
    w = open_page(server, f"#/compare/{fixed.run_id}/{bug.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    ranges = """['A', 'B'].map(k => {
        const t = document.getElementById('chart-cmp-heat-' + k).data[0];
        return [t.zmin, t.zmax]; })"""
    wait_js(w.page, f"() => JSON.stringify({ranges}) === JSON.stringify([[-13, 0], [-13, 0]])")
    # Live rows that need more decades widen both.
    bug.send([with_profile(5, [10.0 ** (-20 + t / 6) for t in range(121)])])
    wait_js(w.page, f"() => JSON.stringify({ranges}) === JSON.stringify([[-20, 0], [-20, 0]])")
    assert_clean(w)


def weighted_overhead(server: Any, run_id: str, first: int) -> float:
    """Sum(overhead x duration) / sum(duration) of steps >= first, from the API."""
    fields = get_json(
        server, f"/api/runs/{run_id}/steps?fields=overhead,duration_s&from={first}&max_points=5000"
    )["fields"]
    durations = dict(zip(fields["duration_s"]["step"], fields["duration_s"]["value"], strict=True))
    pairs = [(o, durations[s]) for s, o in zip(fields["overhead"]["step"],
                                                 fields["overhead"]["value"], strict=True)]
    return sum(o * d for o, d in pairs) / sum(d for _, d in pairs)


def budget_step(step: int) -> dict[str, Any]:
    """A step of a default watch(): light steps of 2-6 % and every 40th a heavy step
    that costs about what the step itself does (and takes twice as long)."""
    heavy = step % 40 == 0
    rec = light_step(step, (0.02 if heavy else 0.01) * (1 + 0.3 * math.sin(step)))
    rec["overhead"] = 1.1 if heavy else 0.04 + 0.02 * math.sin(step / 7)
    return rec


def test_overhead_stat_is_the_time_weighted_share_of_recent_steps_not_the_last_step(
    gradwatch_server, open_page, raw_trainer
):
    """The last step's own share flips between a light step's few per cent and a heavy
    step's 100 %+; the stat shows what the run pays over its last 500 steps, equal to
    the API's numbers, from history and then live."""
    server = gradwatch_server()
    # a default watch(): the 2 % budget, whose light steps measure what capture hides
    trainer = raw_trainer(server, "overhead-share", config={"every": 1, "overhead": 0.02})
    trainer.send([budget_step(s) for s in range(700)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-scalars='1']")
    stat = w.page.locator("[data-stat='gradwatch overhead']")
    expected = weighted_overhead(server, trainer.run_id, 200)
    assert abs(expected - 0.04) > 0.01  # not a light step's share: the heavy ones count
    assert stat.inner_text() == f"{expected * 100:.1f} %"
    assert "steps 200-699" in (stat.get_attribute("title") or "")
    # Live: a heavy step last (its own share 110 %), the stat still the window's share
    trainer.send([budget_step(s) for s in range(700, 801)])
    live = weighted_overhead(server, trainer.run_id, 301)
    assert abs(live - expected) >= 0.0005  # the shown figure has to move
    text = f"{live * 100:.1f} %"
    wait_js(w.page, "() => document.querySelector(\"[data-stat='gradwatch overhead']\")"
                    f".textContent === '{text}'")
    title = stat.get_attribute("title") or ""
    assert "steps 301-800" in title and "step 800 alone: 110.0 %" in title, title
    assert_clean(w)


@pytest.mark.parametrize(("config", "bound"), [
    ({"every": 1, "overhead": None}, True), ({"every": 2}, True),
    ({"every": 10, "overhead": None}, False), ({"every": 1, "overhead": 0.05}, False),
])
def test_overhead_stat_says_at_least_where_no_light_step_measures_the_unseen_cost(
    gradwatch_server, open_page, raw_trainer, config: dict[str, Any], bound: bool
):
    """With every=1 or 2 and no budget, what capture slows down inside autograd is not
    measured (docs/CAPTURE.md): the figure is a lower bound and says so."""
    server = gradwatch_server()
    trainer = raw_trainer(server, "overhead-bound", config=config)
    trainer.send([budget_step(s) for s in range(1, 40)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-scalars='1']")
    stat = w.page.locator("[data-stat='gradwatch overhead']")
    share = weighted_overhead(server, trainer.run_id, 0)
    assert stat.inner_text() == ("≥ " if bound else "") + f"{share * 100:.1f} %"
    assert ("at least" in (stat.get_attribute("title") or "")) == bound
    assert_clean(w)
