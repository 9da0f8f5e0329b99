"""Charts stay legible with many lines (issue 16): titles inside their chart, distinct
colours, the largest lines shown and the rest a click or a search away, round ticks on
right-hand axes, whole decades on log axes, and no auto-margin redraw loops."""

from __future__ import annotations

import math
from typing import Any

import pytest

from .conftest import step_record, wait_js

pytestmark = pytest.mark.browser
PARAMS = 14
ALL_DRAWN = "() => [...document.querySelectorAll('.chart:not([hidden])')].every(d => d.data)"


def busy_step(step: int) -> dict[str, Any]:
    rec = step_record(step)
    rec["param_norms"] = {f"enc.layer{i}.weight": 10.0 ** (i / 4 - 2) for i in range(PARAMS)}
    modules = ["emb", "lstm", "head", "dropout", "norm"]
    rec["profile"] = {
        m: {"forward_s": 1e-3 * (k + 1), "backward_s": 2e-3 * (k + 1), "calls": 3 + k}
        for k, m in enumerate(modules)
    }
    rec["rss_bytes"] = 376_000_000 + step * 10_000
    return rec


def round_step(dtick: float) -> bool:
    mantissa = dtick / 10 ** math.floor(math.log10(dtick))
    return any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5, 10))


def test_many_lines_stay_legible(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "many-params")
    trainer.send([busy_step(s) for s in range(40)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    warnings: list[str] = []
    w.page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    w.page.wait_for_selector("body[data-scalars='1']")
    w.page.emulate_media(media="print")  # every chart drawn
    wait_js(w.page, ALL_DRAWN)
    w.page.emulate_media(media="screen")
    # Fourteen parameters: the eight largest drawn, all in the legend, grouped by module.
    norms = w.page.evaluate("""() => document.getElementById('chart-norms').data
        .map(t => [t.name, t.visible === undefined ? true : t.visible, t.legendgroup || null])""")
    shown = [n for n, v, g in norms if v is True and g]
    assert len(shown) == 8 and len(norms) == PARAMS + 1, norms
    assert set(shown) == {f"enc.layer{i}.weight" for i in range(PARAMS - 8, PARAMS)}
    assert {g for _, _, g in norms if g} == {f"enc.layer{i}" for i in range(PARAMS)}
    w.page.fill("#search-norms", "layer1")  # layer1, layer10 … layer13
    wait_js(
        w.page,
        """() => document.getElementById('chart-norms').data
        .filter(t => t.legendgroup && t.visible === true).length === 5""",
    )
    # Distinct colours for every line of a chart with more than ten.
    colours = w.page.evaluate("""() => document.getElementById('chart-modules')._fullData
        .map(t => t.line.color)""")
    assert len(colours) == 15 and len(set(colours)) == 15, colours
    # Right-hand axes tick at round numbers; log axes at whole decades or 1-2-5.
    for chart_id in ("chart-graph", "chart-modules"):
        find = f"document.getElementById('{chart_id}')"
        dtick = w.page.evaluate(f"() => {find}._fullLayout.yaxis2.dtick")
        assert round_step(float(dtick)), (chart_id, dtick)
    for chart_id in ("chart-norms", "chart-gates"):
        dtick = w.page.evaluate(f"() => document.getElementById('{chart_id}').layout.yaxis.dtick")
        assert dtick in (1, "D2"), (chart_id, dtick)
    # Axis titles lie inside their chart (not cut at its edges).
    cut = w.page.evaluate("""() => [...document.querySelectorAll('.chart:not([hidden])')]
      .flatMap(d => {
        const box = d.getBoundingClientRect();
        const titles = d.querySelectorAll('.g-xtitle text, .g-ytitle text, .g-y2title text');
        return [...titles].filter(t => {
            const r = t.getBoundingClientRect();
            return r.width && (r.left < box.left - 1 || r.right > box.right + 1
                || r.top < box.top - 1 || r.bottom > box.bottom + 1);
        }).map(t => d.id + ': ' + t.textContent);
    })""")
    assert cut == [], cut
    assert not [m for m in warnings if "auto-margin" in m], warnings
    assert w.errors == [], w.errors
