"""hotspot: a module that dominates step time in many calls per step."""

from __future__ import annotations

from typing import Any

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def step(n: int, duration_s: float, profile: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), "duration_s": duration_s, "profile": profile}


def entry(forward_s: float, backward_s: float, calls: int) -> dict[str, Any]:
    return {"forward_s": forward_s, "backward_s": backward_s, "calls": calls}


LOOPED = {
    "": entry(0.09, 0.0, 1),
    "encoder": entry(0.004, 0.008, 1),
    "decoder": entry(0.03, 0.045, 24),
    "decoder.attention": entry(0.012, 0.02, 24),
    "decoder.cell": entry(0.008, 0.012, 24),
}


def test_hotspot_names_the_looped_module_its_calls_and_where_inside() -> None:
    (alert,) = DiagnosisEngine().observe(step(1, 0.1, LOOPED))
    ev = alert["evidence"]
    assert (alert["code"], alert["subject"]) == ("hotspot", "decoder")
    assert ev["calls"] == 24 and ev["share"] == 0.75
    assert ev["children"] == {"attention": 0.32, "cell": 0.2}
    assert "24 calls per step" in alert["message"] and "attention 32%" in alert["message"]
    assert "batch" in alert["hint"]


def test_hotspot_ignores_a_module_that_dominates_in_one_call() -> None:
    batched = {
        "": entry(0.05, 0.0, 1),
        "decoder": entry(0.02, 0.03, 1),
        "encoder": entry(0.01, 0.01, 1),
    }
    assert DiagnosisEngine().observe(step(1, 0.06, batched)) == []


def test_hotspot_thresholds_are_configurable_and_it_clears() -> None:
    engine = DiagnosisEngine({"hotspot_share": 0.8, "clear_after": 1})
    assert engine.observe(step(1, 0.1, LOOPED)) == []  # 75% < 80%
    engine = DiagnosisEngine({"hotspot_min_calls": 2, "clear_after": 1})
    assert [a["state"] for a in engine.observe(step(1, 0.1, LOOPED))] == ["raised"]
    quiet = dict(LOOPED, decoder=entry(0.001, 0.001, 24))
    assert [a["state"] for a in engine.observe(step(2, 0.1, quiet))] == ["cleared"]


def test_hotspot_needs_a_profile() -> None:
    record = {"kind": "step", "step": 0, "t": 0.0, "duration_s": 0.1}
    assert DiagnosisEngine().observe(record) == []
