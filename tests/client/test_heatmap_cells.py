"""The heatmap's cells hold the right step's values at the right timestep, from history
and live: every step here has its own profile, so a row drawn for the wrong step, a
frame's rows in the wrong order or timesteps reversed all show as a wrong cell."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import chart, step_record, wait_js

pytestmark = pytest.mark.browser

HEAT = "chart-heatmap-lstm-input"


def log_cell(step: int, t: int) -> float:
    """log10 of the norm at (step, timestep t): each step has its own level and a slope
    that differs from its neighbours' (seven slopes, all among the first seven steps),
    so both the default relative scale and the absolute one tell rows of a frame apart,
    and live frames stay inside the colour range that history set (so they are appended,
    not redrawn)."""
    return -float(step % 3) - slope(step) * t


def slope(step: int) -> float:
    return 0.1 + 0.01 * ((3 * step) % 7)


def relative_cell(step: int, t: int) -> float:
    """What the default scale draws: decades below the step's peak (timestep 0)."""
    return log_cell(step, t) - log_cell(step, 0)


def record(step: int, timesteps: int) -> dict[str, Any]:
    rec = step_record(step, timesteps=timesteps)
    rec["timesteps"] = {"lstm": {"input": [10.0 ** log_cell(step, t) for t in range(timesteps)]}}
    return rec


def assert_cells(page: Any, steps: list[int], width: int) -> None:
    """Every drawn row is the step its label says, cell by cell; columns past the step's
    own sequence length are empty."""
    y = chart(page, HEAT, "Array.from(d.data[0].y)")
    z = chart(page, HEAT, "d.data[0].z.map(r => Array.from(r))")
    assert y == steps
    for row, step in zip(z, steps, strict=True):
        length = 30 if step < 20 else width
        assert len(row) == width, (step, len(row))
        for t in range(length):
            assert row[t] == pytest.approx(relative_cell(step, t), abs=1e-4), (step, t, row[t])
        assert all(v is None for v in row[length:]), (step, row[length:])


def test_heatmap_cells_hold_each_steps_own_profile_from_history_and_live(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "distinct-profiles")
    trainer.send([record(s, 30) for s in range(7)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    assert_cells(w.page, list(range(7)), 30)
    # A few known cells by value, read from the chart independently of the helper above.
    assert chart(w.page, HEAT, "d.data[0].z[3][0]") == pytest.approx(0.0, abs=1e-4)
    assert chart(w.page, HEAT, "d.data[0].z[3][10]") == pytest.approx(-1.2, abs=1e-4)
    assert chart(w.page, HEAT, "d.data[0].z[5][29]") == pytest.approx(-3.19, abs=1e-4)
    # Live: each batch of five steps lands in one frame (one extendTraces).
    for start in (7, 12):
        trainer.send([record(s, 30) for s in range(start, start + 5)])
    trainer.send([record(s, 30) for s in (17, 18, 19)])
    wait_js(w.page, f"() => document.getElementById('{HEAT}').data[0].z.length === 20")
    assert_cells(w.page, list(range(20)), 30)
    assert chart(w.page, HEAT, "d.data[0].z[8][0]") == pytest.approx(0.0, abs=1e-4)
    assert chart(w.page, HEAT, "d.data[0].z[13][10]") == pytest.approx(-1.4, abs=1e-4)
    # Longer sequences arrive: the trace is rebuilt wider, old rows padded with gaps.
    trainer.send([record(s, 40) for s in range(20, 24)])
    wait_js(w.page, f"() => document.getElementById('{HEAT}').data[0].z.length === 24")
    assert_cells(w.page, list(range(24)), 40)
    assert chart(w.page, HEAT, "d.data[0].z[22][39]") == pytest.approx(-5.07, abs=1e-4)
    assert w.errors == [], w.errors
    assert w.foreign_requests() == [], w.foreign_requests()
