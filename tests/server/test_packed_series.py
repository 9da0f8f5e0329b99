"""Per-timestep series sent packed (``{"f64": base64 of little-endian float64}``,
docs/PROTOCOL.md) are stored bit for bit like lists of numbers, reach live viewers,
and a bad packed series is refused with what was wrong."""

from __future__ import annotations

import base64
import json
import struct

import pytest

# Values a vanishing or exploding run produces: far below fp32's range, signed zero,
# the largest double, and every non-finite value.
VALUES = [1e-300, 5e-324, 1e-29, -0.0, 0.5, 1.7976931348623157e308]
NONFINITE = [float("nan"), float("inf"), float("-inf")]


def packed(values: list[float], urlsafe: bool = False) -> dict[str, str]:
    raw = struct.pack(f"<{len(values)}d", *values)
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return {"f64": encode(raw).decode()}


def test_packed_and_listed_series_are_stored_alike(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    values = VALUES + NONFINITE
    listed = [*VALUES, "NaN", "Infinity", "-Infinity"]
    records = [
        wire.step(0, timesteps={"lstm1": {"input": listed}}),
        wire.step(1, timesteps={"lstm1": {"input": packed(values)}}),
        wire.step(2, timesteps={"lstm1": {"input": packed(values, urlsafe=True)}}),
        wire.step(3, timesteps={"lstm1": {"input": packed([])}}),
    ]
    assert [a["seq"] for a in wire.send_run(server, run_id, [records])] == [0]
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1&series=input")
    assert heat["steps"] == [0, 1, 2, 3]
    assert heat["values"][:3] == [listed, listed, listed]
    assert heat["values"][3] == []
    # Bit for bit: the sign of -0.0 and the smallest subnormal survive the blob.
    assert struct.pack("<d", heat["values"][1][3]) == struct.pack("<d", -0.0)
    assert heat["values"][1][1] == 5e-324


def test_live_viewers_get_the_packed_series_back(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        record = wire.step(1, timesteps={"m": {"hidden": packed(VALUES)}})
        wire.send_run(server, run_id, [[record]])
        message = wire.recv(viewer)
    assert message["type"] == "records"
    series = message["records"][0]["timesteps"]["m"]["hidden"]
    raw = base64.urlsafe_b64decode(series["f64"])
    assert list(struct.unpack(f"<{len(VALUES)}d", raw)) == VALUES


def _batch(series: object) -> str:
    return json.dumps(
        {
            "type": "batch",
            "run_id": "packed-run",
            "rank": 0,
            "seq": 0,
            "records": [{"kind": "step", "step": 0, "timesteps": {"lstm": {"input": series}}}],
        }
    )


HELLO = json.dumps({"type": "hello", "protocol": 1, "run_id": "packed-run", "rank": 0})
WHERE = "records[0].timesteps.lstm.input"


@pytest.mark.parametrize(
    ("series", "says"),
    [
        ({"f64": "AAAA$AAA"}, f"{WHERE}.f64: expected base64 of little-endian float64 values"),
        ({"f64": "AAAA"}, f"{WHERE}.f64: expected whole float64 values (a multiple of 8 bytes),"
                          " got 3 bytes"),
        ({"f64": 12}, f"{WHERE}.f64: expected a base64 string, got 12"),
        ({"f64": "AAAAAAAAAAA=", "dtype": "f4"}, f'{WHERE}.dtype: expected only "f64"'),
        ({"values": [1]}, f"{WHERE}.f64: expected a value, got nothing"),
        ("1,2,3", f'{WHERE}: expected a list of numbers or {{"f64": '),
        ([1.0, "x"], f'{WHERE}[1]: expected a number or "NaN"/"Infinity"/"-Infinity", got'),
        ({"f64": base64.b64encode(b"\0" * 8 * 100_001).decode()},
         f"{WHERE}.f64: expected at most 100000 float64 values (800000 bytes), got more"),
    ],
)
def test_a_bad_packed_series_is_left_out_with_what_was_wrong(
    shared_gradwatch_server, wire, series, says
):
    # One bad field costs only itself: the step is stored without its series and the
    # ack's notice says what was wrong with it (docs/PROTOCOL.md, "ack").
    run_id = wire.run_id()
    batch = json.loads(_batch(series))
    batch["run_id"] = run_id
    batch["records"][0]["loss"] = 0.5
    with wire.connect(shared_gradwatch_server) as ws:
        ws.send(json.dumps({**json.loads(HELLO), "run_id": run_id}))
        ws.send(json.dumps(batch))
        ack = wire.recv(ws)
    assert ack["type"] == "ack" and ack["seq"] == 0, ack
    assert says in ack["notice"] and "the field was left out" in ack["notice"], ack["notice"]
    got = wire.get_ok(shared_gradwatch_server, f"/api/runs/{run_id}/steps?fields=loss")
    assert got["fields"]["loss"]["step"] == [0] and got["fields"]["loss"]["value"] == [0.5]
    heat = wire.get_ok(shared_gradwatch_server, f"/api/runs/{run_id}/timesteps?module=lstm")
    assert heat["steps"] == []
