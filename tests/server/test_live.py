"""/ws/live: viewers get what was stored, as it is stored; a slow viewer loses its
oldest messages (and is told), never slowing ingest or the other viewers."""

from __future__ import annotations

import json
import socket
import threading
import time

from websockets.sync.client import connect


def _records_until(wire, viewer, last_seq, timeout=60.0):
    """Every live message of `viewer` up to and including the batch `last_seq`."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = wire.recv(viewer, timeout=deadline - time.monotonic())
        got.append(message)
        if message.get("type") == "records" and message["seq"] == last_seq:
            return got
    raise AssertionError(f"batch {last_seq} never reached the viewer; got {len(got)} messages")


def test_viewer_receives_stored_records_after_the_ack(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        records = [wire.step(0, loss="NaN"), {"kind": "epoch", "epoch": 0, "step": 0}]
        acks = wire.send_run(server, run_id, [records])
        assert acks == [{"type": "ack", "seq": 0, "live": True}]
        message = wire.recv(viewer)
    assert message["type"] == "records"
    assert (message["run_id"], message["rank"], message["seq"]) == (run_id, 0, 0)
    # Exactly as sent: non-finite numbers as strings, no fields added.
    assert message["records"] == records


def test_run_list_viewer_sees_a_new_run_and_its_end(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    with wire.connect(server, "/ws/live") as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": None}
        wire.send_run(server, run_id, [[wire.step(0)], [{"kind": "end", "status": "finished"}]])
        statuses = []
        while "finished" not in statuses:
            message = wire.recv(viewer)
            assert message["type"] == "run"
            assert message["run"]["id"] == run_id
            statuses.append(message["run"]["status"])
    assert statuses[-1] == "finished"


def test_slow_viewer_loses_oldest_and_is_told_while_others_get_everything(gradwatch_server, wire):
    # The trainer waits for each ack before the next batch, so a viewer that keeps up
    # never has more than a message or two queued; a stuck one overflows its 32.
    server = gradwatch_server(env={"GRADWATCH_LIVE_QUEUE_SIZE": "32"})
    run_id = wire.run_id()
    batches = 250
    # The slow viewer's socket has a tiny receive buffer and its client reads at most one
    # message ahead, so the server's sends to it block once the kernel buffers are full.
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", server.port))
    fast_got: list[dict] = []
    with (
        connect(
            server.url + f"/ws/live?run={run_id}", sock=raw, max_queue=1, max_size=None
        ) as slow,
        wire.connect(server, f"/ws/live?run={run_id}") as fast,
    ):
        assert wire.recv(slow)["type"] == "subscribed"
        assert wire.recv(fast)["type"] == "subscribed"
        reader = threading.Thread(
            target=lambda: fast_got.extend(_records_until(wire, fast, batches - 1))
        )
        reader.start()
        # ~40 KB per batch, ~10 MB in all: more than the socket buffers (~4 MB) and the
        # queue hold together.
        with wire.connect(server) as trainer:
            trainer.send(json.dumps(wire.hello(run_id)))
            for seq in range(batches):
                records = [wire.step(seq * 10 + i, length=100) for i in range(10)]
                trainer.send(json.dumps(wire.batch(run_id, seq, records)))
                # ingest never waited (and the run has viewers: "live")
                assert wire.recv(trainer) == {"type": "ack", "seq": seq, "live": True}
        reader.join(timeout=90)
        assert not reader.is_alive()
        assert [m["seq"] for m in fast_got] == list(range(batches))  # nothing lost, in order
        slow_got = _records_until(wire, slow, batches - 1)
    lagged = [m for m in slow_got if m["type"] == "lagged"]
    seqs = [m["seq"] for m in slow_got if m["type"] == "records"]
    assert lagged, "the slow viewer was never told it lost messages"
    assert sum(m["dropped"] for m in lagged) + len(seqs) == batches
    assert seqs == sorted(seqs)
    assert seqs[-1] == batches - 1  # the newest survive, the oldest are dropped


def test_viewer_needs_no_run_to_exist_yet(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer)["type"] == "subscribed"
        wire.send_run(server, run_id, [[wire.step(7)]])
        assert wire.recv(viewer)["records"][0]["step"] == 7
    assert json.dumps(wire.get_ok(server, f"/api/runs/{run_id}")["last_step"]) == "7"
