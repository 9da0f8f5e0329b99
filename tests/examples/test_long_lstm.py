"""examples/long_lstm.py: the bug raises `vanishing` on `lstm`; the fixed twin is silent."""

from __future__ import annotations

from typing import Any


def test_long_lstm_bug_raises_vanishing_on_lstm_with_a_truncation_length(run_example: Any) -> None:
    summary, steps, alerts = run_example("long_lstm", "--steps", "4")
    assert len(steps) == 4 and all(len(s["timesteps"]["lstm"]["input"]) == 121 for s in steps)
    raised = [a for a in alerts if a["state"] == "raised"]
    assert [(a["code"], a["subject"]) for a in raised] == [("vanishing", "lstm")]
    alert = raised[0]
    assert alert["step"] < 10
    ev = alert["evidence"]
    assert ev["timesteps"] == 121 and ev["horizon"] >= 60  # most timesteps get nothing
    # the horizon agrees with the recorded series itself
    norms = steps[alert["step"]]["timesteps"]["lstm"]["input"]
    assert min(t for t, v in enumerate(norms) if v >= 1e-3 * max(norms)) == ev["horizon"]
    assert (
        f"truncated BPTT in chunks of about {ev['suggested_truncation']} timesteps" in alert["hint"]
    )
    assert summary["fixed"] is False


def test_long_lstm_fixed_twin_raises_nothing(run_example: Any) -> None:
    _, steps, alerts = run_example("long_lstm", "--fixed", "--steps", "10")
    assert len(steps) == 10
    # slowdown is judged on step times over hundreds of steps: the false-alarm suite
    # (tests/trainer_hooks/test_false_alarms.py) runs this twin 500 steps under jitter
    assert [a for a in alerts if a["code"] != "slowdown"] == []
