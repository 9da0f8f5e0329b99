"""Acks tell a trainer whether anyone watches its run live, and the trainer's
background thread hands records over at the live pace only then (pipeline.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradwatch.protocol.sender import WebSocketSink
from gradwatch.trainer_hooks.pipeline import MIN_GAP_S, QUIET_GAP_S, Item, Pipeline


def test_acks_say_whether_the_run_has_a_live_viewer_and_the_pace_follows(
    gradwatch_server: Any, gradwatch_db: str, wire: Any, tmp_path: Path
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id, other = wire.run_id(), wire.run_id()
    sink = WebSocketSink(server.url, wire.hello(run_id), spool=tmp_path / "run.jsonl",
                         announce=False)
    pipeline = Pipeline(sink, quantities=[])
    step = 0

    def hand_over(steps: int) -> None:
        nonlocal step
        for _ in range(steps):
            pipeline.put(Item({"kind": "step", "step": step, "t": 1.0, "duration_s": 0.01}))
            step += 1
        assert pipeline.flush(timeout=30) and sink.flush(timeout=30)  # acked

    try:
        # until a server says, the sink is taken as watched: the live pace
        assert sink.viewed is True and pipeline.gap() == MIN_GAP_S
        hand_over(3)
        assert sink.viewed is False and pipeline.gap() == QUIET_GAP_S  # nobody watches
        # a viewer of another run changes nothing for this one
        with wire.connect(server, f"/ws/live?run={other}") as elsewhere:
            assert wire.recv(elsewhere)["type"] == "subscribed"
            hand_over(2)
            assert sink.viewed is False
        with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
            assert wire.recv(viewer)["type"] == "subscribed"
            hand_over(4)
            assert sink.viewed is True and pipeline.gap() == MIN_GAP_S
            got = [r["step"] for r in wire.recv(viewer)["records"]]
            assert got and set(got) <= set(range(5, 9))
        hand_over(1)  # the viewer left: the quiet pace again
        assert sink.viewed is False and pipeline.gap() == QUIET_GAP_S
    finally:
        assert pipeline.close(timeout=30)
    stored = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=duration_s")
    assert stored["fields"]["duration_s"]["step"] == list(range(10))  # nothing lost
