"""The dashed line on the "Latest per-timestep profile" is the horizon of the profile it
is drawn over (earliest timestep within 1e-3 of its peak, the caption's definition),
never the horizon an older vanishing alert reported: after the loss moved onto every
timestep and the alert cleared, no line at the alert's old timestep is left; a new
alert's figure does not replace the latest profile's own horizon. Real server, real
Chromium, from history and live."""

from __future__ import annotations

from typing import Any

import pytest

from gradwatch.server.report_charts import horizon

from .conftest import alert_record, assert_clean, chart, step_record, wait_js

pytestmark = pytest.mark.browser

TIMESTEPS = 121
LINES = "d.data.filter(t => t.name.startsWith('horizon')).map(t => [t.name, Array.from(t.x)])"


def with_profile(step: int, values: list[float]) -> dict[str, Any]:
    record = step_record(step, timesteps=TIMESTEPS)
    record["timesteps"] = {"lstm": {"input": values}}
    return record


def cut_at(first: int) -> list[float]:
    """A profile whose horizon is ``first``: no gradient before it, 1.0 from it on."""
    return [1e-12] * first + [1.0] * (TIMESTEPS - first)


def cleared(step: int) -> dict[str, Any]:
    alert = alert_record(step)
    alert["state"] = "cleared"
    alert["evidence"] = {}
    return alert


def drawn_lines(page: Any) -> list[list[Any]]:
    return chart(page, "chart-profile", LINES)


def test_a_cleared_alerts_horizon_is_not_drawn_over_the_latest_profile(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "loss-moves-to-every-timestep")
    # The loss on the last timestep: vanishing, raised with horizon 101 at step 5...
    trainer.send([step_record(s, timesteps=TIMESTEPS) for s in range(6)] + [alert_record(5)])
    # ...then on every timestep: the gradient reaches t = 0 and the alert clears.
    trainer.send([with_profile(s, [1.0] * TIMESTEPS) for s in range(6, 10)] + [cleared(9)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    wait_js(w.page, "() => (document.getElementById('chart-profile').data || []).length > 0")
    # The step-9 profile reaches back to t = 0: no horizon line at all.
    assert horizon([1.0] * TIMESTEPS) == 0
    assert drawn_lines(w.page) == []
    assert_clean(w)


def test_a_live_alert_does_not_replace_the_latest_profiles_own_horizon(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "horizon-live")
    trainer.send([with_profile(s, cut_at(40)) for s in range(4)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    wait_js(w.page, """() => (document.getElementById('chart-profile').data || [])
        .some(t => t.name === 'horizon lstm: t = 40')""")
    # An alert (its evidence: horizon 101) arrives live with step 4's profile, whose own
    # horizon is 60.
    trainer.send([with_profile(4, cut_at(60)), alert_record(4)])
    w.page.wait_for_selector("#alerts-list article.alert[data-code=vanishing]")
    wait_js(w.page, """() => (document.getElementById('chart-profile').data || [])
        .some(t => t.name === 'horizon lstm: t = 60')""")
    assert drawn_lines(w.page) == [["horizon lstm: t = 60", [60, 60]]]
    assert_clean(w)
