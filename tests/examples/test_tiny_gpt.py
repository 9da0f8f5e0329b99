"""examples/tiny_gpt.py: the padded batch raises `spike` on `loss` at its step; the twin
is silent."""

from __future__ import annotations

from typing import Any


def test_tiny_gpt_padded_batch_raises_a_spike_at_its_step(run_example: Any) -> None:
    summary, steps, alerts = run_example("tiny_gpt", "--steps", "84")
    assert len(steps) == 84 and summary["poison_step"] == 80
    # the stack of blocks is found by itself: three blocks, every step (every=1)
    assert all(len(s["depth"]["blocks"]) == 3 for s in steps)
    assert all(min(s["depth"]["blocks"]) > 0 for s in steps)
    assert "blocks.0.attn.in_proj_weight" in steps[-1]["update_ratios"]
    raised = [a for a in alerts if a["state"] == "raised"]
    assert [(a["code"], a["subject"], a["step"]) for a in raised] == [("spike", "loss", 80)]
    spike = raised[0]
    assert spike["problem"] == "spike" and spike["opens_problem"] is True
    # evidence has 3 significant figures of the loss the example itself saw
    assert abs(spike["evidence"]["loss"] - summary["losses"][80]) <= 0.005 * summary["losses"][80]
    assert spike["evidence"]["ratio"] > 1.5 and spike["evidence"]["z"] >= 6
    assert "step 80" in spike["message"]
    cleared = [a for a in alerts if a["state"] == "cleared"]
    assert [(a["code"], a["subject"]) for a in cleared] == [("spike", "loss")]
    assert cleared[0]["step"] == 83  # three steps back in band


def test_tiny_gpt_fixed_twin_raises_nothing(run_example: Any) -> None:
    summary, steps, alerts = run_example("tiny_gpt", "--fixed", "--steps", "84")
    assert len(steps) == 84 and summary["fixed"] is True
    assert [a for a in alerts if a["code"] != "slowdown"] == []
