"""A model with hundreds of parameters (issue 19, item 4): the gradient-norm chart
draws the largest eight as traces, not one trace per parameter, re-ranks them as live
points arrive, and a search draws any other parameter with the values the API
stores; the same in a replay."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

import pytest

from .conftest import chart, scroll_to, step_record, wait_js

pytestmark = pytest.mark.browser
BLOCKS = 40
NAMES = [f"blocks.{b}.{layer}.{kind}" for b in range(BLOCKS) for layer in ("attn", "mlp")
         for kind in ("weight", "bias", "norm.weight", "norm.bias")]  # 320 parameters
JUMPER = "blocks.2.attn.bias"  # small until step 30, then the largest of all
SEARCHED = "blocks.17.mlp.norm.bias"  # never among the largest


def norm(name: str, step: int) -> float:
    if name == JUMPER and step >= 30:
        return 50.0 + step
    i = NAMES.index(name)
    return 10.0 ** (-3 + 3 * i / len(NAMES)) * (1 + step / 100)


def big_step(step: int) -> dict[str, Any]:
    rec = step_record(step)
    rec["param_norms"] = {n: norm(n, step) for n in NAMES}
    rec.pop("gate_norms")
    return rec


GROUPED = "d.data.filter((t) => t.legendgroup).map((t) => t.name)"


def top(step: int, k: int = 8) -> list[str]:
    return sorted(sorted(NAMES, key=lambda n: -norm(n, step))[:k])


def api_series(server: Any, run_id: str, name: str) -> dict[str, list[Any]]:
    field = urllib.parse.quote(f"param_norms/{name}")
    url = f"{server.http}/api/runs/{run_id}/steps?rank=0&fields={field}"
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - loopback
        return json.loads(answer.read())["fields"][f"param_norms/{name}"]


def search(page: Any, text: str, names: list[str]) -> None:
    """Type `text` into the norm chart's search and wait for exactly `names` drawn."""
    page.fill("#search-norms", text)
    want = json.dumps(json.dumps(sorted(names), separators=(",", ":")))  # as JSON.stringify
    wait_js(page, f"""() => {{ const d = document.getElementById('chart-norms');
        return JSON.stringify({GROUPED}.sort()) === {want}; }}""")


def check_searched(page: Any, server: Any, run_id: str) -> None:
    search(page, SEARCHED, [SEARCHED])
    trace = chart(page, "chart-norms", f"d.data.find((t) => t.name === {json.dumps(SEARCHED)})")
    stored = api_series(server, run_id, SEARCHED)
    assert trace["x"] == stored["step"] == list(range(40))
    assert trace["y"] == pytest.approx(stored["value"], rel=1e-12)
    assert trace["y"] == pytest.approx([norm(SEARCHED, s) for s in range(40)], rel=1e-12)
    # a search matching many draws at most 24 of them, the largest
    many = [n for n in NAMES if n.startswith("blocks.3")]  # blocks.3 and blocks.30-39: 88
    search(page, "blocks.3", sorted(many, key=lambda n: -norm(n, 39))[:24])
    search(page, "", top(39))  # cleared: the largest again


def test_a_model_with_hundreds_of_parameters_draws_the_largest_and_finds_the_rest(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "big-model")
    trainer.send([big_step(s) for s in range(20)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    scroll_to(w.page, "chart-norms")
    wait_js(w.page, "() => document.getElementById('chart-norms').dataset.lines === '320'")
    # eight parameter traces and the total, not 321 traces
    assert sorted(chart(w.page, "chart-norms", GROUPED)) == top(19)
    assert chart(w.page, "chart-norms", "d.data.length") == 9
    assert "320" in w.page.get_attribute("#search-norms", "placeholder")

    # live: one parameter overtakes the others at step 30; it is drawn, one drops out
    for start in (20, 30):
        trainer.send([big_step(s) for s in range(start, start + 10)])
    wait_js(w.page, f"""() => {{ const d = document.getElementById('chart-norms');
        const t = d.data.find((t) => t.name === {json.dumps(JUMPER)});
        return !!t && t.x.length === 40; }}""")
    assert sorted(chart(w.page, "chart-norms", GROUPED)) == top(39)
    assert JUMPER in top(39) and JUMPER not in top(19)
    jumper = chart(w.page, "chart-norms", f"d.data.find((t) => t.name === {json.dumps(JUMPER)})")
    assert jumper["y"] == pytest.approx([norm(JUMPER, s) for s in range(40)], rel=1e-12)
    total = chart(w.page, "chart-norms", "d.data.find((t) => t.name === 'total norm').x.length")
    assert total == 40
    check_searched(w.page, server, trainer.run_id)
    assert w.errors == [], w.errors

    # a replay unfolds the same from history, bounded and searchable
    r = open_page(server, f"#/replay/{trainer.run_id}")
    r.page.wait_for_selector("#replay-speed")
    r.page.evaluate("() => { const v = window.gradwatch.state.view; v.seek(v.items.length); }")
    wait_js(r.page, "() => document.getElementById('replay-label').textContent"
                    ".startsWith('replayed all')")
    scroll_to(r.page, "chart-norms")
    wait_js(r.page, """() => { const d = document.getElementById('chart-norms');
        return d.dataset.lines === '320'
            && d.data.find((t) => t.name === 'total norm').x.length === 40; }""")
    assert sorted(chart(r.page, "chart-norms", GROUPED)) == top(39)
    assert chart(r.page, "chart-norms", "d.data.length") == 9
    check_searched(r.page, server, trainer.run_id)
    assert r.errors == [], r.errors


def test_a_live_run_that_starts_with_hundreds_of_parameters_is_bounded_at_once(
    gradwatch_server, open_page, raw_trainer
):
    # the page is open before the first record: the chart is drawn empty, and the
    # first live batch brings 320 parameters at once
    server = gradwatch_server()
    trainer = raw_trainer(server, "big-model-live")
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    trainer.send([big_step(0)])
    scroll_to(w.page, "chart-norms")
    wait_js(w.page, "() => document.getElementById('chart-norms').dataset.lines === '320'")
    trainer.send([big_step(s) for s in range(1, 40)])
    wait_js(w.page, """() => { const d = document.getElementById('chart-norms');
        const t = d.data.find((t) => t.name === 'total norm');
        return !!t && t.x.length === 40; }""")
    wait_js(w.page, f"""() => !!document.getElementById('chart-norms').data
        .find((t) => t.name === {json.dumps(JUMPER)})""")
    assert sorted(chart(w.page, "chart-norms", GROUPED)) == top(39)
    assert chart(w.page, "chart-norms", "d.data.length") == 9
    check_searched(w.page, server, trainer.run_id)
    assert w.errors == [], w.errors
