"""Gradient flow through depth read back from a real server (issue 19): ``depth`` series
as a depth x step matrix (``/depth``), ``update_ratios`` per parameter (``/steps``) and
summed up per block (``/update_ratios``), on SQLite and PostgreSQL; live viewers get
both fields as sent; a bad depth field costs only itself."""

from __future__ import annotations

import base64
import json
import random
import struct
from typing import Any
from urllib.parse import quote

BLOCKS = ["layers.0", "layers.1", "layers.2"]
PARAMS = ["layers.0.w", "layers.0.b", "layers.1.w", "layers.2.w", "layers.2.b", "head.weight"]


def hello(run_id: str) -> dict[str, Any]:
    return {
        "type": "hello", "protocol": 1, "run_id": run_id, "run": "depth",
        "model": {"modules": [{"name": n, "type": "Block"} for n in BLOCKS]},
        "config": {"depth": ["layers", "trunk"], "depth_blocks": {"layers": BLOCKS}},
    }


def packed(values: list[float]) -> dict[str, str]:
    return {"f64": base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode()}


def records(rng: random.Random, steps: range) -> list[dict[str, Any]]:
    """Step records with depth (listed or packed) and ratios on even steps only."""
    out = []
    for step in steps:
        record: dict[str, Any] = {"kind": "step", "step": step, "loss": rng.random()}
        if step % 2 == 0:
            depth = [rng.random() * 10.0 ** -rng.randint(0, 30) for _ in BLOCKS]
            record["depth"] = {"layers": depth if step % 4 else packed(depth),
                               "trunk": [rng.random(), 0.0]}
            record["update_ratios"] = {p: rng.random() * 1e-3 for p in PARAMS}
            record["param_norms"] = {p: rng.random() for p in PARAMS}
        out.append(record)
    return out


def send(wire: Any, server: Any, run_id: str, batches: list[list[dict[str, Any]]]) -> list[Any]:
    with wire.connect(server) as ws:
        ws.send(json.dumps(hello(run_id)))
        for seq, batch in enumerate(batches):
            ws.send(json.dumps(wire.batch(run_id, seq, batch)))
        return [wire.recv(ws) for _ in batches]


def unpacked(series: Any) -> list[float]:
    if isinstance(series, dict):
        text = series["f64"].replace("+", "-").replace("/", "_")  # either alphabet
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return list(struct.unpack(f"<{len(raw) // 8}d", raw))
    return list(series)


def test_depth_matrix_and_ratios_read_back_as_sent(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    sent = records(random.Random(7), range(40))
    acks = send(wire, server, run_id, [sent[:13], sent[13:]])  # a block cut mid-run
    assert all("notice" not in a for a in acks), acks
    with_depth = [r for r in sent if "depth" in r]

    run = wire.get_ok(server, f"/api/runs/{run_id}")
    assert run["depth"] == ["layers", "trunk"]
    assert run["update_ratio_parameters"] == sorted(PARAMS)
    assert "depth" not in run["series"]  # the time heatmaps' list stays theirs

    heat = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=layers")
    assert heat["steps"] == [r["step"] for r in with_depth]
    assert heat["values"] == [unpacked(r["depth"]["layers"]) for r in with_depth]
    assert heat["blocks"] == BLOCKS and heat["max_blocks"] == 3
    trunk = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=trunk&from=10&to=20")
    assert trunk["steps"] == [10, 12, 14, 16, 18, 20] and trunk["blocks"] == []
    assert trunk["values"] == [r["depth"]["trunk"] for r in with_depth if 10 <= r["step"] <= 20]
    few = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=layers&max_steps=3")
    assert few["steps"][0] == 0 and few["steps"][-1] == 38 and len(few["steps"]) == 3
    assert few["total_steps"] == 20

    # One parameter's ratios over /steps, exactly as sent.
    name = quote("update_ratios/layers.0.b", safe="")
    one = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields={name}")["fields"]
    assert one["update_ratios/layers.0.b"]["step"] == [r["step"] for r in with_depth]
    assert one["update_ratios/layers.0.b"]["value"] == [
        r["update_ratios"]["layers.0.b"] for r in with_depth
    ]
    # Per block: the largest ratio of its parameters at each step.
    blocks = wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")
    assert blocks["steps"] == [r["step"] for r in with_depth]
    assert [b["name"] for b in blocks["blocks"]] == [*BLOCKS, "head"]
    assert [b["stack"] for b in blocks["blocks"]] == ["layers"] * 3 + [None]
    by_name = {b["name"]: b for b in blocks["blocks"]}
    assert by_name["layers.0"]["parameters"] == ["layers.0.b", "layers.0.w"]
    for block in [*BLOCKS, "head"]:
        members = [p for p in PARAMS if p.startswith(block + ".")]
        expected = [max(r["update_ratios"][p] for p in members) for r in with_depth]
        assert by_name[block]["values"] == expected, block


def test_block_ratios_skip_infinite_weights_and_leave_gaps(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    sent = [
        # A LayerNorm bias that was all zero: Infinity; the block reads its weight's.
        {"kind": "step", "step": 0, "update_ratios": {"layers.0.w": 2e-3, "layers.0.b": "Infinity",
                                                       "layers.1.w": "Infinity"}},
        {"kind": "step", "step": 1, "update_ratios": {"layers.0.w": "NaN", "layers.0.b": "NaN"}},
        {"kind": "step", "step": 2, "update_ratios": {"layers.0.w": 1e-4, "layers.1.w": 5e-3}},
    ]
    assert "notice" not in send(wire, server, run_id, [sent])[0]
    answer = wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")
    assert answer["steps"] == [0, 1, 2]
    values = {b["name"]: b["values"] for b in answer["blocks"]}
    assert values == {"layers.0": [2e-3, "NaN", 1e-4], "layers.1": ["Infinity", None, 5e-3]}


def test_live_viewers_get_depth_and_ratios(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    depth = [0.5, 1e-300, 0.0]
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        record = {"kind": "step", "step": 3, "depth": {"layers": packed(depth), "b": [1.0, 2.0]},
                  "update_ratios": {"layers.0.w": 1e-3, "x": "Infinity"}}
        send(wire, server, run_id, [[record]])
        message = wire.recv(viewer)
    (got,) = message["records"]
    assert unpacked(got["depth"]["layers"]) == depth and got["depth"]["b"] == [1.0, 2.0]
    assert got["update_ratios"] == {"layers.0.w": 1e-3, "x": "Infinity"}


def test_a_bad_depth_field_costs_only_itself(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    sent = [
        {"kind": "step", "step": 0, "loss": 0.5, "depth": {"layers": "deep"},
         "update_ratios": {"layers.0.w": 1e-3}},
        {"kind": "step", "step": 1, "loss": 0.25, "depth": {"layers": [1.0, 2.0]},
         "update_ratios": {"layers.0.w": [1]}},
    ]
    (ack,) = send(wire, server, run_id, [sent])
    assert "records[0].depth.layers" in ack["notice"] and "left out" in ack["notice"]
    assert "records[1].update_ratios.layers.0.w" in ack["notice"]
    heat = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=layers")
    assert heat["steps"] == [1] and heat["values"] == [[1.0, 2.0]]
    ratios = wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")
    assert ratios["steps"] == [0] and ratios["blocks"][0]["values"] == [1e-3]
    loss = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")["fields"]["loss"]
    assert loss["value"] == [0.5, 0.25]


def test_depth_answers_say_what_is_wrong(gradwatch_server, wire):
    server = gradwatch_server()
    status, body, _ = wire.get(server, "/api/runs/nope/depth?stack=layers")
    assert status == 404 and "expected a known run id" in body["detail"]
    status, body, _ = wire.get(server, "/api/runs/nope/update_ratios")
    assert status == 404
    run_id = wire.run_id()
    send(wire, server, run_id, [[{"kind": "step", "step": 0, "loss": 1.0}]])
    status, body, _ = wire.get(server, f"/api/runs/{run_id}/depth")
    assert status == 422 and "stack" in body["detail"]
    empty = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=none")
    assert empty["steps"] == [] and empty["values"] == [] and empty["max_blocks"] == 0
    assert wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")["blocks"] == []


def test_depth_answers_need_the_view_token(gradwatch_server, wire):
    server = gradwatch_server(token="ingest-secret", view_token="view-secret")
    run_id = wire.run_id()
    with wire.connect(server, token="ingest-secret") as ws:
        ws.send(json.dumps(hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, records(random.Random(1), range(2)))))
        assert wire.recv(ws) == {"type": "ack", "seq": 0, "live": False}
    for path in (f"/api/runs/{run_id}/depth?stack=layers", f"/api/runs/{run_id}/update_ratios"):
        status, body, _ = wire.get(server, path)
        assert status == 401 and "expected a view token" in body["detail"], path
        status, body, _ = wire.get(server, path, token="view-secret")
        assert status == 200 and body["steps"] == [0], (path, body)


def test_a_step_sent_again_reads_its_latest_ratios_and_depth(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    first = [{"kind": "step", "step": s, "depth": {"layers": [1.0, 2.0]},
              "update_ratios": {"layers.0.w": 1e-3, "layers.1.w": 2e-3}} for s in range(3)]
    again = {"kind": "step", "step": 1, "depth": {"layers": [5.0, 6.0]},
             "update_ratios": {"layers.0.w": 7e-3, "layers.1.w": 1e-4}}
    send(wire, server, run_id, [first, [again]])  # a resumed trainer sends step 1 again
    ratios = wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")
    assert ratios["steps"] == [0, 1, 2]
    assert {b["name"]: b["values"] for b in ratios["blocks"]} == {
        "layers.0": [1e-3, 7e-3, 1e-3], "layers.1": [2e-3, 1e-4, 2e-3]}
    heat = wire.get_ok(server, f"/api/runs/{run_id}/depth?stack=layers")
    assert heat["steps"] == [0, 1, 2] and heat["values"][1] == [5.0, 6.0]


def test_a_ratio_a_step_sent_again_lacks_keeps_its_earlier_value(
    gradwatch_server, gradwatch_db, wire
):
    """Each ratio of a step sent twice comes from the last record that holds it, in
    /update_ratios as in /steps (a named scalar's rule)."""
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    first = [{"kind": "step", "step": s, "update_ratios": {"a.w": 1e-3, "b.w": 2e-3}}
             for s in range(3)]
    again = {"kind": "step", "step": 1, "update_ratios": {"a.w": 7e-3}}
    send(wire, server, run_id, [first, [again]])
    ratios = wire.get_ok(server, f"/api/runs/{run_id}/update_ratios")
    assert {b["name"]: b["values"] for b in ratios["blocks"]} == {
        "a": [1e-3, 7e-3, 1e-3], "b": [2e-3, 2e-3, 2e-3]}
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=update_ratios/b.w")
    assert steps["fields"]["update_ratios/b.w"]["value"] == [2e-3, 2e-3, 2e-3]
