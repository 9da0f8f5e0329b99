"""hotspot: a module that dominates the forward pass in many calls per step."""

from __future__ import annotations

from typing import Any

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def step(n: int, duration_s: float, profile: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), "duration_s": duration_s, "profile": profile}


def entry(forward_s: float, backward_s: float, calls: int) -> dict[str, Any]:
    return {"forward_s": forward_s, "backward_s": backward_s, "calls": calls}


# Shaped like a real profile of examples/seq2seq_attention.py: the root under its class
# name, and an embedding fed token ids whose 20 backward clocks overlap (longer than the step).
LOOPED = {
    "Seq2Seq": entry(0.040, 0.05, 1),
    "encoder": entry(0.008, 0.015, 1),
    "encoder.lstm": entry(0.007, 0.013, 1),
    "decoder": entry(0.030, 0.050, 20),
    "decoder.embedding": entry(0.001, 0.600, 20),
    "decoder.lstm": entry(0.012, 0.020, 20),
    "decoder.attention": entry(0.009, 0.015, 20),
    "decoder.out": entry(0.002, 0.003, 20),
}


def test_hotspot_names_the_looped_module_its_calls_and_where_inside() -> None:
    (alert,) = DiagnosisEngine({"raise_after": 1}).observe(step(1, 0.1, LOOPED))
    ev = alert["evidence"]
    assert (alert["code"], alert["subject"]) == ("hotspot", "decoder")
    assert ev["calls"] == 20 and ev["share"] == 0.75 and ev["of"] == "the forward pass"
    # shares of the forward pass: the embedding's impossible 0.6 s backward plays no part
    assert ev["children"] == {"embedding": 0.025, "lstm": 0.3, "attention": 0.22, "out": 0.05}
    assert ev["backward_s"] == 0.05
    assert "20 calls per step" in alert["message"] and "lstm 30%" in alert["message"]
    assert "batch" in alert["hint"] and "torch.bmm" in alert["hint"]


def test_hotspot_ignores_a_module_that_dominates_in_one_call() -> None:
    batched = {
        "Seq2Seq": entry(0.02, 0.03, 1),
        "decoder": entry(0.012, 0.02, 1),
        "encoder": entry(0.007, 0.01, 1),
    }
    assert DiagnosisEngine({"raise_after": 1}).observe(step(1, 0.06, batched)) == []


def test_hotspot_without_the_root_entry_uses_the_step_time() -> None:
    profile = {k: v for k, v in LOOPED.items() if k != "Seq2Seq"}
    (alert,) = DiagnosisEngine({"raise_after": 1}).observe(step(1, 0.05, profile))
    assert alert["evidence"]["of"] == "the step" and alert["evidence"]["share"] == 0.6


def test_hotspot_thresholds_are_configurable_and_it_clears() -> None:
    engine = DiagnosisEngine({"raise_after": 1, "hotspot_share": 0.8, "clear_after": 1})
    assert engine.observe(step(1, 0.1, LOOPED)) == []  # 75% < 80%
    assert DiagnosisEngine({"raise_after": 1, "hotspot_min_calls": 21}).observe(step(1, 0.1, LOOPED)) == []
    engine = DiagnosisEngine({"raise_after": 1, "clear_after": 1})
    assert [a["state"] for a in engine.observe(step(1, 0.1, LOOPED))] == ["raised"]
    quiet = dict(LOOPED, decoder=entry(0.001, 0.001, 20))
    assert [a["state"] for a in engine.observe(step(2, 0.1, quiet))] == ["cleared"]


def test_hotspot_needs_a_profile() -> None:
    record = {"kind": "step", "step": 0, "t": 0.0, "duration_s": 0.1}
    assert DiagnosisEngine({"raise_after": 1}).observe(record) == []
