"""examples/rotation_lstm.py: a hidden state never detached; the graph grows; the twin detaches."""

from __future__ import annotations

import itertools
from typing import Any


def test_rotation_lstm_bug_names_lstm1_and_the_graph_grows(run_example: Any) -> None:
    _, steps, alerts = run_example("rotation_lstm", "--steps", "6")
    nodes = [s["graph_nodes"] for s in steps]
    assert all(b > a for a, b in itertools.pairwise(nodes))  # grows every step
    raised = {(a["code"], a["subject"]): a for a in alerts if a["state"] == "raised"}
    stale = raised[("graph_growth", "lstm1")]  # the capture's direct check
    assert stale["step"] < 10 and "detach" in stale["hint"]
    graph = raised[("graph_growth", "graph")]  # the trend, from the diagnoses
    assert (
        graph["step"] < 10
        and graph["evidence"]["graph_nodes"] == nodes[: len(graph["evidence"]["graph_nodes"])]
    )
    assert "lstm1" in graph["message"] and "h.detach()" in graph["hint"]


def test_rotation_lstm_fixed_twin_raises_nothing(run_example: Any) -> None:
    _, steps, alerts = run_example("rotation_lstm", "--fixed", "--steps", "10")
    walked = [s["graph_nodes"] for s in steps if "graph_nodes" in s]  # the walk is paced
    assert len(walked) >= 3 and len(set(walked)) == 1
    # slowdown is judged on step times over hundreds of steps: the false-alarm suite
    # (tests/trainer_hooks/test_false_alarms.py) runs this twin 500 steps under jitter
    assert [a for a in alerts if a["code"] != "slowdown"] == []
