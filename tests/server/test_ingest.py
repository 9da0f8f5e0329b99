"""/ws/ingest against a real server: acknowledged after commit, stored once, and
every bad message refused with an error message and a close code."""

from __future__ import annotations

import json

import pytest

HUGE = 5 * 1024 * 1024


def test_batches_are_acknowledged_in_order_and_stored(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    batches = [[wire.step(s * 5 + i) for i in range(5)] for s in range(8)]
    acks = wire.send_run(server, run_id, batches)
    assert acks == [{"type": "ack", "seq": s, "live": False} for s in range(8)]
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss,graph_nodes")
    assert steps["total"] == 40
    assert steps["fields"]["graph_nodes"]["step"] == list(range(40))
    assert steps["fields"]["graph_nodes"]["value"] == [100 + s for s in range(40)]


def test_repeated_seq_is_acknowledged_but_stored_once(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    first = [[wire.step(0), wire.step(1)], [wire.step(2)]]
    assert [a["seq"] for a in wire.send_run(server, run_id, first)] == [0, 1]
    # A trainer that reconnects resends what it believes unacknowledged, then goes on.
    again = [[wire.step(0), wire.step(1)], [wire.step(2)], [wire.step(3)]]
    assert [a["seq"] for a in wire.send_run(server, run_id, again)] == [0, 1, 2]
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")
    assert steps["fields"]["loss"]["step"] == [0, 1, 2, 3]
    assert wire.get_ok(server, f"/api/runs/{run_id}")["last_step"] == 3


def test_nonfinite_numbers_round_trip_as_strings(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    record = wire.step(
        0,
        loss="NaN",
        total_norm="Infinity",
        param_norms={"lstm1.weight_0": "-Infinity", "lstm1.weight_1": 2.5},
        timesteps={"lstm1": {"input": [1e-30, "NaN", "Infinity", 0.5]}},
    )
    wire.send_run(server, run_id, [[record]])
    fields = "loss,total_norm,param_norms/lstm1.weight_0,param_norms/lstm1.weight_1"
    got = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields={fields}")["fields"]
    assert got["loss"]["value"] == ["NaN"]
    assert got["total_norm"]["value"] == ["Infinity"]
    assert got["param_norms/lstm1.weight_0"]["value"] == ["-Infinity"]
    assert got["param_norms/lstm1.weight_1"]["value"] == [2.5]
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1")
    assert heat["values"] == [[1e-30, "NaN", "Infinity", 0.5]]


def _refused(server, wire, messages):
    """Send `messages` on a fresh connection; return the error and the close."""
    with wire.connect(server) as ws:
        for message in messages:
            ws.send(message)
        return wire.expect_error(ws)


GOOD_HELLO = json.dumps(
    {"type": "hello", "protocol": 1, "run_id": "refused-run", "run": "r", "rank": 0}
)


@pytest.mark.parametrize(
    ("name", "messages", "code", "says"),
    [
        ("batch before hello", [json.dumps({"type": "batch", "run_id": "x", "rank": 0,
                                            "seq": 0, "records": []})], 1008, "hello first"),
        ("unknown type", [json.dumps({"type": "subscribe"})], 1008, "got 'subscribe'"),
        ("protocol 2", [json.dumps({"type": "hello", "protocol": 2, "run_id": "x"})], 1008,
         "protocol: expected 1, got 2"),
        ("not JSON", ["{nope"], 1007, "invalid JSON"),
        ("bare NaN token", [GOOD_HELLO, '{"type":"batch","run_id":"refused-run","rank":0,'
                            '"seq":0,"records":[{"kind":"step","step":1,"loss":NaN}]}'], 1007,
         "records[0].loss"),
        ("mistyped step", [GOOD_HELLO, json.dumps({"type": "batch", "run_id": "refused-run",
                           "rank": 0, "seq": 0, "records": [{"kind": "step", "step": "7"}]})],
         1007, "records[0].step: expected a valid integer, got '7'"),
        ("unknown record kind", [GOOD_HELLO, json.dumps({"type": "batch", "run_id": "refused-run",
                                 "rank": 0, "seq": 0, "records": [{"kind": "weights"}]})],
         1007, "records[0].kind: expected 'step', 'epoch', 'alert' or 'end', got 'weights'"),
        ("batch of another run", [GOOD_HELLO, json.dumps({"type": "batch", "run_id": "other",
                                  "rank": 0, "seq": 0, "records": []})], 1008, "run_id"),
        ("too big", [GOOD_HELLO, json.dumps({"type": "batch", "run_id": "refused-run",
                     "rank": 0, "seq": 0, "records": [], "pad": "x" * HUGE})], 1009,
         "at most 4194304 bytes"),
        ("binary frame", [b'{"type": "hello"}'], 1007, "binary"),
    ],
)
def test_bad_message_gets_error_then_close_code(
    shared_gradwatch_server, wire, name, messages, code, says
):
    error, close_code, reason = _refused(shared_gradwatch_server, wire, messages)
    assert error["type"] == "error"
    assert error["code"] == code
    assert says in error["message"], error["message"]
    assert close_code == code
    assert 0 < len(reason.encode()) <= 123


def test_refused_batch_stores_nothing_and_earlier_batches_stay(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0), wire.step(1)])))
        # The second batch is bad in its last record only: none of it may be stored.
        bad = wire.batch(run_id, 1, [wire.step(2), wire.step(3), {"kind": "step", "step": -1}])
        ws.send(json.dumps(bad))
        assert wire.recv(ws) == {"type": "ack", "seq": 0, "live": False}
        error, code, _ = wire.expect_error(ws)
    assert code == 1007
    assert error["message"].startswith("records[2].step: expected greater than or equal to 0")
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")
    assert steps["fields"]["loss"]["step"] == [0, 1]


def test_a_refused_connection_does_not_disturb_another_trainer(gradwatch_server, wire):
    server = gradwatch_server()
    good_run = wire.run_id()
    with wire.connect(server) as good:
        good.send(json.dumps(wire.hello(good_run)))
        good.send(json.dumps(wire.batch(good_run, 0, [wire.step(0)])))
        assert wire.recv(good)["seq"] == 0
        with wire.connect(server) as bad:
            bad.send("definitely not json")
            assert wire.expect_error(bad)[1] == 1007
        good.send(json.dumps(wire.batch(good_run, 1, [wire.step(1)])))
        assert wire.recv(good) == {"type": "ack", "seq": 1, "live": False}
    assert wire.get_ok(server, f"/api/runs/{good_run}")["last_step"] == 1


def test_a_new_session_of_the_same_run_is_not_taken_for_repeats(
    gradwatch_server, gradwatch_db, wire
):
    """A resumed trainer process counts seq from 0 again; its hello's `session` tells the
    server that these are new batches, while repeats within a session stay deduplicated."""
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    for session, steps in (("process-1", range(0, 3)), ("process-2", range(3, 6))):
        for _ in range(2):  # each process also resends its batches once
            with wire.connect(server) as ws:
                ws.send(json.dumps({**wire.hello(run_id), "session": session}))
                for seq, step in enumerate(steps):
                    ws.send(json.dumps(wire.batch(run_id, seq, [wire.step(step)])))
                assert [wire.recv(ws)["seq"] for _ in steps] == [0, 1, 2]
    stored = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=graph_nodes")
    assert stored["fields"]["graph_nodes"]["step"] == list(range(6))
