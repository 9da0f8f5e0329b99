"""What users rely on from two diagnoses, checked with profiles that are not monotone
and graphs that stop growing. Each test watches the engine over many steps and filters
by code, so it holds whatever hysteresis or thresholds the detectors use:

- vanishing: the horizon is the *earliest* timestep that gets gradient, so a sequence
  whose first timesteps get gradient is silent however deep a dip later on;
- graph_growth: an alert raised while the graph grows clears once it levels off.
"""

from __future__ import annotations

from typing import Any

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine

STEPS = 40


def alerts_of(code: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every alert of ``code`` one engine emits over ``records``, in order."""
    engine = DiagnosisEngine()
    return [a for r in records for a in engine.observe(r) if a["code"] == code]


def timesteps_step(n: int, norms: list[float]) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), "timesteps": {"lstm": {"input": norms}}}


DIPS = {
    # the case: a deep dip between two healthy stretches
    "dip-in-the-middle": [1.0] + [1e-6] * 60 + [1.0] * 60,
    # gradient at the start, then a long stretch of nothing, then back at the end
    "late-recovery": [0.5, 0.8] + [1e-9] * 90 + [0.3] * 8,
    # oscillating by 1e5 every few timesteps
    "oscillating": [(1.0 if (t // 7) % 2 == 0 else 1e-5) for t in range(120)],
    # a peak in the middle, the first timestep at 1e-2 of it, a trough before the end
    "peaked": [1e-2 * (1 + t) for t in range(50)] + [1e-7] * 40 + [0.9] * 30,
}


@pytest.mark.parametrize("name", sorted(DIPS))
def test_vanishing_is_silent_when_the_first_timesteps_get_gradient(name: str) -> None:
    norms = DIPS[name]
    assert norms[0] >= 1e-3 * max(norms)  # timestep 0 is within reach: nothing vanished
    records = [timesteps_step(n, norms) for n in range(STEPS)]
    assert alerts_of("vanishing", records) == []


def test_vanishing_horizon_is_the_earliest_timestep_with_gradient_despite_a_later_dip() -> None:
    # No gradient for the first 40 timesteps, then gradient with a dip at 60-69: the
    # horizon is 40 (where gradient first arrives), not 70 (after the last dip).
    norms = [1e-9] * 40 + [1.0] * 20 + [1e-8] * 10 + [1.0] * 51
    alerts = alerts_of("vanishing", [timesteps_step(n, norms) for n in range(STEPS)])
    raised = [a for a in alerts if a["state"] != "cleared"]
    assert raised, "a sequence with 40 of 121 timesteps out of reach raised nothing"
    for alert in raised:
        assert alert["subject"] == "lstm"
        assert (alert["evidence"]["horizon"], alert["evidence"]["reach"]) == (40, 81)
        assert "only 81 of 121 timesteps" in alert["message"]


def graph_step(n: int, nodes: int) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), "graph_nodes": nodes}


@pytest.mark.parametrize(("start", "per_step", "grow_for"), [(120, 40, 20), (900, 300, 30)])
def test_graph_growth_clears_after_the_graph_levels_off(
    start: int, per_step: int, grow_for: int
) -> None:
    sizes = [start + per_step * n for n in range(grow_for)]
    # Level off at the size reached, with the jitter of a real graph (+-1 node).
    sizes += [sizes[-1] + (n % 3) - 1 for n in range(80)]
    alerts = alerts_of("graph_growth", [graph_step(n, s) for n, s in enumerate(sizes)])
    states = [a["state"] for a in alerts if a["subject"] == "graph"]
    assert states, "a graph that grew steadily raised nothing"
    assert states[0] == "raised"
    assert states[-1] == "cleared", states
    cleared_at = max(i for i, a in enumerate(alerts) if a["state"] == "cleared")
    assert alerts[cleared_at]["step"] >= grow_for  # cleared by the levelling off


def test_graph_growth_raises_again_when_a_levelled_graph_grows_again() -> None:
    sizes = [200 + 50 * n for n in range(20)]
    sizes += [sizes[-1]] * 60
    sizes += [sizes[-1] + 80 * n for n in range(1, 25)]
    alerts = alerts_of("graph_growth", [graph_step(n, s) for n, s in enumerate(sizes)])
    states = [a["state"] for a in alerts if a["subject"] == "graph"]
    # raised (maybe updated), cleared on the plateau, raised again on the second climb
    assert "cleared" in states
    first_clear = states.index("cleared")
    assert states[0] == "raised" and "raised" in states[first_clear:]
