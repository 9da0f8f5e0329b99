"""The figures of a run longer than its history's 2,000 points (min/max downsampled):
after a reload the stats row holds the last step's own values, and a replay ends on the
last step's own values and on the true overhead share of the steps it names.

Both used to take their figures from the downsampled series, where a field's last
point is its bucket's min or max: the stats row showed values of several steps under
one step number, and the replay ended on blanks and an overhead window of extremes."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from .conftest import assert_clean, wait_js

pytestmark = pytest.mark.browser

LAST = 2103  # its history bucket (steps 2100-2103) shows two of its four steps
HEAVY_EVERY = 7  # steps with a gradient norm and a graph size; LAST is not one
WINDOW = 500  # the overhead stat's window (client/js/overhead.js)
STATS = ["step", "loss", "total norm", "step time", "graph nodes", "memory", "gradwatch overhead"]


def record(step: int) -> dict[str, Any]:
    heavy = step % HEAVY_EVERY == 0
    rec: dict[str, Any] = {
        "kind": "step", "step": step, "epoch": 0, "t": time.time(),
        "duration_s": 0.01 + 0.004 * ((step * 37) % 11) / 10,
        "loss": 2 + math.sin(1.7 * step),
        "rss_bytes": 300_000_000 + ((step * 7919) % 1000) * 4096,
        # a heavy step costs far more than a light one: a window made of bucket maxima
        # is mostly heavy steps
        "overhead": 0.4 if heavy else 0.02 + 0.001 * (step % 5),
    }  # fmt: skip
    if heavy:
        rec.update(total_norm=1 + math.cos(step), graph_nodes=40 + step % 13)
    return rec


def send_long_run(raw_trainer: Any, server: Any) -> Any:
    trainer = raw_trainer(server, "long-run", config={})  # the default budget
    records = [record(s) for s in range(LAST + 1)]
    for start in range(0, len(records), 500):
        trainer.send(records[start : start + 500])
    return trainer


def expected_stats(page: Any) -> dict[str, str]:
    """The stats row of step LAST, formatted by the page's own formatters."""
    last = record(LAST)
    window = [record(s) for s in range(LAST - WINDOW + 1, LAST + 1)]
    share = sum(r["overhead"] * r["duration_s"] for r in window) / sum(
        r["duration_s"] for r in window
    )
    return dict(page.evaluate(
        """async ([last, share, first]) => {
            const n = await import("/static/js/num.js");
            return { step: n.fmt(last.step), loss: n.fmt(last.loss), "total norm": "–",
                "step time": n.fmtSeconds(last.duration_s), "graph nodes": "–",
                memory: n.fmtBytes(last.rss_bytes),
                "gradwatch overhead": `${(share * 100).toFixed(1)} %`,
                window: `steps ${n.fmt(first)}-${n.fmt(last.step)},` };
        }""",
        [last, share, LAST - WINDOW + 1],
    ))  # fmt: skip


def shown_stats(page: Any) -> dict[str, str]:
    return {k: page.inner_text(f"[data-stat='{k}']") for k in STATS}


def test_reload_stats_show_the_last_steps_own_values(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = send_long_run(raw_trainer, server)
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1'][data-scalars='1']")
    want = expected_stats(w.page)
    window = want.pop("window")
    assert shown_stats(w.page) == want
    assert window in w.page.get_attribute("[data-stat='gradwatch overhead']", "title")
    assert_clean(w)


def test_replay_ends_on_the_last_steps_own_values_and_true_overhead(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = send_long_run(raw_trainer, server)
    w = open_page(server, f"#/replay/{trainer.run_id}")
    w.page.wait_for_selector("#replay-position")
    w.page.evaluate("""() => { const slider = document.getElementById("replay-position");
        slider.value = slider.max; slider.dispatchEvent(new Event("change")); }""")
    wait_js(
        w.page,
        "() => document.getElementById('replay-label').textContent.startsWith('replayed all')",
    )
    want = expected_stats(w.page)
    window = want.pop("window")
    assert shown_stats(w.page) == want
    assert window in w.page.get_attribute("[data-stat='gradwatch overhead']", "title")
    assert_clean(w)
