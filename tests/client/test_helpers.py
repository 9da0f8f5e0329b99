"""The dashboard's number helpers, run in Chromium as the page loads them, agree with
the HTML report's Python twins: a chart means the same live and in a shared report."""

from __future__ import annotations

from typing import Any

import pytest

from gradwatch.server.report_charts import horizon, log_norm

pytestmark = pytest.mark.browser

PROFILES = [
    [0.5 * 0.78 ** (120 - t) for t in range(121)],  # vanishing: reaches back ~27 steps
    [1.0] * 50,  # healthy: every timestep counts
    [0.0, 0.0, "NaN", 1e-5, 1.0, "Infinity"],  # non-finite values on the wire
    [0.0, 0.0],  # no gradient at all
    [3e-4, 1.0, 2e-3, 5e-1],
]
NORMS = [0.0, -1.0, 1e-40, 1e-30, 3.2e-7, 1.0, 999.0, 1e9, "NaN", "Infinity", "-Infinity", None]


def test_horizon_and_heatmap_scale_match_the_report(gradwatch_server, open_page):
    server = gradwatch_server()
    w = open_page(server)
    w.page.wait_for_selector("body[data-painted='1']")
    js: Any = w.page.evaluate(
        """async ([profiles, norms]) => {
            const p = await import("/static/js/profile.js");
            const n = await import("/static/js/num.js");
            return {
                horizons: profiles.map((v) => p.horizon(v)),
                logs: norms.map((v) => n.logNorm(v)),
            };
        }""",
        [PROFILES, NORMS],
    )
    assert js["horizons"] == [horizon(p) for p in PROFILES]
    assert js["logs"] == pytest.approx([log_norm(v) for v in NORMS])
    assert js["horizons"][0] > 90  # the vanishing profile's early timesteps are cut off
    assert js["horizons"][1] == 0
    assert w.errors == []


def test_packed_series_decode_in_the_page_as_python_packs_them(gradwatch_server, open_page):
    from gradwatch.protocol.codec import packed_series

    values = [1.234e-29, 5e-324, -0.0, 0.5, 1.7976931348623157e308]
    standard = packed_series(values)
    urlsafe = {"f64": standard["f64"].replace("+", "-").replace("/", "_")}
    server = gradwatch_server()
    w = open_page(server)
    w.page.wait_for_selector("body[data-painted='1']")
    js: Any = w.page.evaluate(
        """async ([standard, urlsafe, nonfinite]) => {
            const n = await import("/static/js/num.js");
            const text = (v) => (v === null ? null : v.map((x) => String(x)));
            return {
                standard: n.seriesValues(standard),
                urlsafe: n.seriesValues(urlsafe),
                nonfinite: text(n.seriesValues(nonfinite)),
                negzero: Object.is(n.seriesValues(standard)[2], -0),
                list: n.seriesValues([1, "NaN"]),
                bad: [n.seriesValues({ f64: "%%%" }), n.seriesValues("1,2"), n.seriesValues(null)],
            };
        }""",
        [standard, urlsafe, packed_series([float("nan"), float("inf"), float("-inf")])],
    )
    assert js["standard"] == values and js["urlsafe"] == values
    assert js["negzero"] is True
    assert js["nonfinite"] == ["NaN", "Infinity", "-Infinity"]
    assert js["list"] == [1, "NaN"]
    assert js["bad"] == [None, None, None]
    assert w.errors == []
