"""examples/tree_gru.py: state kept on tree objects chains epochs; the twin resets it."""

from __future__ import annotations

import itertools
from typing import Any


def test_tree_gru_bug_names_the_cell_and_the_graph_grows_epoch_over_epoch(run_example: Any) -> None:
    summary, steps, alerts = run_example("tree_gru", "--steps", "10")
    nodes = [s["graph_nodes"] for s in steps]
    epochs = [nodes[i] + nodes[i + 1] for i in range(0, 10, 2)]  # 2 steps per epoch
    assert all(b > a for a, b in itertools.pairwise(epochs))
    raised = {(a["code"], a["subject"]): a for a in alerts if a["state"] == "raised"}
    stale = raised[("graph_growth", "cell")]
    assert stale["step"] < 10 and "detach" in stale["hint"]
    graph = raised[("graph_growth", "graph")]
    assert graph["step"] < 10 and "cell" in graph["message"]
    assert len(summary["epoch_s"]) == 5


def test_tree_gru_fixed_twin_raises_nothing(run_example: Any) -> None:
    _, steps, alerts = run_example("tree_gru", "--fixed", "--steps", "10")
    assert len(steps) == 10
    assert alerts == []
