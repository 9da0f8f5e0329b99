"""A batch is stored once per (run_id, rank, session, seq): two ranks of one run that
share a session (a launcher that hands every rank the same one, or a spool replayed
without one) and send the same seqs both keep every step, and a resend from either
rank is still acknowledged and not stored twice. On both backends."""

from __future__ import annotations

import json

import pytest

STEPS_PER_BATCH = 3
BATCHES = 4


def losses(rank: int) -> list[float]:
    # Distinct per rank and per step, so a rank's steps cannot pass for the other's.
    return [round(10.0 * (rank + 1) + 0.25 * s, 2) for s in range(STEPS_PER_BATCH * BATCHES)]


def send_rank(server, wire, run_id: str, rank: int, session: str | None) -> list[dict]:
    """hello, then every batch of ``rank`` (seqs 0..BATCHES-1), then the acks."""
    hello = wire.hello(run_id, rank=rank, world_size=2)
    if session is not None:
        hello["session"] = session
    values = losses(rank)
    with wire.connect(server) as ws:
        ws.send(json.dumps(hello))
        for seq in range(BATCHES):
            steps = range(seq * STEPS_PER_BATCH, (seq + 1) * STEPS_PER_BATCH)
            records = [wire.step(s, loss=values[s]) for s in steps]
            ws.send(json.dumps(wire.batch(run_id, seq, records, rank=rank)))
        return [wire.recv(ws) for _ in range(BATCHES)]


@pytest.mark.parametrize("session", ["shared-session-1", "", None], ids=["same", "empty", "none"])
def test_two_ranks_with_one_session_keep_every_step(gradwatch_server, gradwatch_db, wire, session):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    acks = [{"type": "ack", "seq": seq, "live": False} for seq in range(BATCHES)]
    for rank in (0, 1):
        assert send_rank(server, wire, run_id, rank, session) == acks
    # A resend of everything, rank 1 first: acknowledged again, stored no second time.
    for rank in (1, 0):
        assert send_rank(server, wire, run_id, rank, session) == acks
    total = STEPS_PER_BATCH * BATCHES
    for rank in (0, 1):
        body = wire.get_ok(server, f"/api/runs/{run_id}/steps?rank={rank}&fields=loss")
        assert body["total"] == total, (rank, body["total"])
        assert body["fields"]["loss"]["step"] == list(range(total))
        assert body["fields"]["loss"]["value"] == losses(rank), rank
