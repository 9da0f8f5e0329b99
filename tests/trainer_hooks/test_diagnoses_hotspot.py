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
    assert (
        DiagnosisEngine({"raise_after": 1, "hotspot_min_calls": 21}).observe(step(1, 0.1, LOOPED))
        == []
    )
    engine = DiagnosisEngine({"raise_after": 1, "clear_after": 1})
    assert [a["state"] for a in engine.observe(step(1, 0.1, LOOPED))] == ["raised"]
    quiet = dict(LOOPED, decoder=entry(0.001, 0.001, 20))
    assert [a["state"] for a in engine.observe(step(2, 0.1, quiet))] == ["cleared"]


def test_hotspot_needs_a_profile() -> None:
    record = {"kind": "step", "step": 0, "t": 0.0, "duration_s": 0.1}
    assert DiagnosisEngine({"raise_after": 1}).observe(record) == []


def tutorial(rng: Any) -> dict[str, Any]:
    """Shaped like the PyTorch seq2seq tutorial: the decoder runs once per step and
    loops over 10 target tokens, calling Bahdanau attention and a fused GRU each time;
    which of the two takes longer changes from step to step."""
    att, gru = rng.uniform(0.008, 0.02), rng.uniform(0.008, 0.02)
    return {
        "Seq2Seq": entry(0.05, 0.06, 1),
        "encoder": entry(0.008, 0.01, 1),
        "encoder.gru": entry(0.007, 0.009, 1),
        "decoder": entry(0.04, 0.05, 1),
        "decoder.embedding": entry(0.001, 0.0, 10),
        "decoder.attention": entry(att, 0.01, 10),
        "decoder.attention.Ua": entry(att / 3, 0.003, 10),
        "decoder.attention.Wa": entry(att / 4, 0.003, 10),
        "decoder.gru": entry(gru, 0.02, 10),
        "decoder.out": entry(0.002, 0.002, 10),
    }


def test_hotspot_names_the_module_that_holds_the_loop_and_never_flaps_between_children() -> None:
    import random

    rng = random.Random(5)
    engine = DiagnosisEngine()
    alerts = []
    # what the profiler measures in the tutorial's decoder (test_profile_same_input.py)
    same = {
        "decoder.attention": {
            "args": ["keys"],
            "of": 2,
            "calls": 10,
            "from": {"keys": "decoder:keys"},
        },
        "decoder.attention.Ua": {
            "args": ["input"],
            "of": 1,
            "calls": 10,
            "from": {"input": "decoder.attention:keys"},
        },
    }
    for n in range(40):
        record = step(n, 0.12 * rng.uniform(0.5, 1.5), tutorial(rng))
        alerts += engine.observe({**record, "same_input": same})
    assert [(a["state"], a["subject"]) for a in alerts if a["state"] != "updated"] == [
        ("raised", "decoder")
    ]
    alert = alerts[0]
    ev = alert["evidence"]
    assert ev["calls"] == 1 and ev["loop_calls"] == 10 and ev["holds_loop"] is True
    assert ev["child_calls"] == {"embedding": 10, "attention": 10, "gru": 10, "out": 10}
    assert set(ev["children"]) == {"embedding", "attention", "gru", "out"}
    assert "loops 10 times per step inside" in alert["message"]
    # the fix moves the key projection out first and keeps the loop when it must stay
    hint = alert["hint"]
    assert "Ua(keys)" in hint and "decoder.attention" in hint
    assert hint.index("Ua(keys)") < hint.index("the loop itself must stay")
    assert "only when no step depends on the previous one" in hint
    assert alert["evidence"]["hoist"]["module"] == "decoder.attention.Ua"


def test_hotspot_names_nothing_to_hoist_without_a_measured_same_input() -> None:
    # the same profile with a child called "attention" and one called "Ua": names are no
    # evidence; without the profiler's same_input the fix guesses nothing
    import random

    engine = DiagnosisEngine({"raise_after": 1})
    (alert,) = engine.observe(step(0, 0.12, tutorial(random.Random(5))))
    assert "hoist" not in alert["evidence"]
    assert "Ua" not in alert["hint"] and "keys" not in alert["hint"]
    assert alert["hint"].startswith("The loop in decoder runs 10 times per step. Batch what")


def test_hotspot_is_not_raised_by_one_step_and_clears_only_after_sustained_absence() -> None:
    engine = DiagnosisEngine({"raise_after": 3, "clear_after": 4})
    quiet = dict(LOOPED, decoder=entry(0.001, 0.001, 20))
    states = []
    for n, prof in enumerate([LOOPED, quiet, LOOPED, LOOPED, LOOPED, quiet, LOOPED] + [quiet] * 4):
        states += [(a["state"], a["step"]) for a in engine.observe(step(n, 0.1, prof))]
    assert states == [("raised", 4), ("cleared", 10)]
