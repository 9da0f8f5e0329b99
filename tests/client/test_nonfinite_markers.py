"""The ✕ markers of the norm chart: one a non-finite step, from history as live, however
many of the step's fields are non-finite. A step with a NaN total norm and a NaN loss
used to get two markers after a reload (57 markers for 55 steps)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import assert_clean, chart, scroll_to, step_record

pytestmark = pytest.mark.browser

BOTH = range(10, 15)  # NaN total norm and NaN loss
LOSS_ONLY = 15
NORM_ONLY = 16


def record(step: int) -> dict[str, Any]:
    rec = step_record(step, nonfinite=step in BOTH or step == NORM_ONLY)
    if step in BOTH or step == LOSS_ONLY:
        rec["loss"] = "NaN"
    return rec


def test_history_draws_one_marker_per_nonfinite_step(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "nan-steps")
    trainer.send([record(s) for s in range(30)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1'][data-scalars='1']")
    scroll_to(w.page, "chart-norms")
    markers = chart(w.page, "chart-norms", "d.data.find((t) => t.name === 'non-finite').x")
    assert markers == [*BOTH, LOSS_ONLY, NORM_ONLY]
    assert_clean(w)
