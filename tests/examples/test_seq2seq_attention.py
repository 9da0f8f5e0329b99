"""examples/seq2seq_attention.py: the looped decoder is a hotspot; the batched twin is not."""

from __future__ import annotations

from typing import Any

import pytest


def test_seq2seq_bug_raises_hotspot_on_the_decoder_with_its_calls(run_example: Any) -> None:
    # 6 steps: raised once it held 3 in a row, and on a loaded machine the first
    # (warm-up) step's share can fall just under hotspot_share (0.38-0.42 at load 12)
    summary, steps, alerts = run_example("seq2seq_attention", "--steps", "6", "--compare", "1")
    assert steps[0]["profile"]["decoder"]["calls"] == 20
    raised = [a for a in alerts if a["state"] == "raised"]
    assert [(a["code"], a["subject"]) for a in raised] == [("hotspot", "decoder")]
    alert = raised[0]
    assert alert["step"] < 10 and alert["evidence"]["calls"] == 20
    assert "20 calls per step" in alert["message"] and "batch" in alert["hint"]
    # both speeds are measured, and both ways compute the same loss
    assert summary["speeds_s"]["looped"] > 0 and summary["speeds_s"]["batched"] > 0
    assert summary["same_loss"][0] == pytest.approx(summary["same_loss"][1], rel=1e-5)


def test_seq2seq_fixed_twin_raises_nothing(run_example: Any) -> None:
    _, steps, alerts = run_example("seq2seq_attention", "--fixed", "--steps", "6", "--compare", "1")
    assert steps[0]["profile"]["decoder"]["calls"] == 1
    # slowdown is judged on step times over hundreds of steps: the false-alarm suite
    # (tests/trainer_hooks/test_false_alarms.py) runs this twin 500 steps under jitter
    assert [a for a in alerts if a["code"] != "slowdown"] == []
