"""Step records sent as columns (docs/PROTOCOL.md, ``columns``) read back exactly as
the same records sent one by one, reach live viewers as records, and a bad block is
refused with what was wrong while nothing of it is stored.

The blocks here are built by ``as_block``, written from the spec alone (not the
trainer's encoder), so the server is checked against the document."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

SCALARS_F64 = ("t", "duration_s", "loss", "total_norm", "overhead")
SCALARS_I64 = ("epoch", "graph_nodes", "rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")


def _b64(fmt: str, values: list[Any]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}{fmt}", *values)).decode()


def _float(value: Any) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value, value)


def as_block(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records of one shape as a block, by the letter of docs/PROTOCOL.md."""
    first = records[0]
    block: dict[str, Any] = {"kind": "step", "n": len(records)}
    block["step"] = {"i64": _b64("q", [r["step"] for r in records])}
    for name in SCALARS_I64:
        if name in first:
            block[name] = {"i64": _b64("q", [r[name] for r in records])}
    if "graph_truncated" in first:
        block["graph_truncated"] = {"i64": _b64("q", [int(r["graph_truncated"]) for r in records])}
    for name in SCALARS_F64:
        if name in first:
            block[name] = {"f64": _b64("d", [_float(r[name]) for r in records])}

    def named(record: dict[str, Any]) -> list[tuple[str, Any]]:
        out = [(f"param_norms/{p}", v) for p, v in record.get("param_norms", {}).items()]
        for p, gates in record.get("gate_norms", {}).items():
            out += [(f"gate_norms/{p}/{g}", v) for g, v in gates.items()]
        for module, entry in record.get("profile", {}).items():
            out += [(f"profile/{module}/{k}", v) for k, v in entry.items()]
        return out

    names = [name for name, _ in named(first)]
    if names:
        values = [_float(v) for r in records for _, v in named(r)]
        block["named"] = {"names": names, "f64": _b64("d", values)}
    if "timesteps" in first:
        block["timesteps"] = {
            module: {
                series: {
                    "len": len(values),
                    "f64": _b64(
                        "d",
                        [_float(v) for r in records for v in r["timesteps"][module][series]],
                    ),
                }
                for series, values in by_series.items()
            }
            for module, by_series in first["timesteps"].items()
        }
    return block


def _records(wire: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Heavy steps (one of them non-finite) and light steps with profile entries."""
    heavy = [wire.step(s) for s in range(0, 40, 2)]
    heavy[3]["loss"] = "NaN"
    heavy[5]["total_norm"] = "Infinity"
    heavy[6]["param_norms"]["lstm1.weight_0"] = "-Infinity"
    heavy[7]["timesteps"]["lstm1"]["input"][0] = "NaN"
    light = [
        {
            "kind": "step",
            "step": s,
            "epoch": s // 100,
            "t": 1_764_460_000.0 + s,
            "duration_s": 0.01,
            "loss": 1.0 / (s + 1),
            "overhead": 0.002,
            "rss_bytes": 10_000_000 + s,
            "graph_truncated": s % 3 == 0,
            "profile": {"decoder.attn": {"forward_s": 0.001 * s, "backward_s": 0.002, "calls": 7}},
        }
        for s in range(1, 40, 2)
    ]
    return heavy, light


def _send(wire: Any, server: Any, run_id: str, batch: dict[str, Any]) -> dict[str, Any]:
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(batch))
        return wire.recv(ws)


def _reads(wire: Any, server: Any, run_id: str) -> dict[str, Any]:
    detail = wire.get_ok(server, f"/api/runs/{run_id}")
    for key in ("id", "started", "updated", "status", "connected", "hello", "ranks"):
        detail.pop(key, None)
    return {
        "detail": detail,
        "steps": wire.get_ok(server, f"/api/runs/{run_id}/steps?max_points=1000"),
        "downsampled": wire.get_ok(server, f"/api/runs/{run_id}/steps?max_points=8"),
        "window": wire.get_ok(server, f"/api/runs/{run_id}/steps?from=7&to=29&max_points=6"),
        "lstm1": wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1&series=input"),
        "lstm1 picked": wire.get_ok(
            server, f"/api/runs/{run_id}/timesteps?module=lstm1&series=input&max_steps=7"
        ),
        "lstm2": wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm2&series=input"),
    }


def _shuffled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Out of step order, and one step far beyond the others (a chunk holds records in
    step order within 4096 steps: this block is cut into several)."""
    records = [dict(r) for r in records]
    records[-1]["step"] = 50_000
    return records[::-1][:5] + sorted(records[::-1][5:], key=lambda r: r["step"] % 7)


@pytest.mark.parametrize("order", ["in order", "shuffled"])
def test_columns_read_back_as_the_same_records(gradwatch_server, gradwatch_db, wire, order):
    server = gradwatch_server(db=gradwatch_db)
    heavy, light = _records(wire)
    if order == "shuffled":
        heavy, light = _shuffled(heavy), _shuffled(light)
    by_records, by_columns = wire.run_id(), wire.run_id()
    ack = _send(wire, server, by_records, wire.batch(by_records, 0, heavy + light))
    assert ack == {"type": "ack", "seq": 0, "live": False}
    blocks = [as_block(heavy), as_block(light)]
    ack = _send(wire, server, by_columns, {**wire.batch(by_columns, 0, []), "columns": blocks})
    assert ack == {"type": "ack", "seq": 0, "live": False}

    expected, got = _reads(wire, server, by_records), _reads(wire, server, by_columns)
    assert got["steps"]["total"] == 40
    assert "param_norms/lstm1.weight_0" in got["steps"]["fields"]
    assert "profile/decoder.attn/calls" in got["steps"]["fields"]
    assert "NaN" in got["steps"]["fields"]["loss"]["value"]
    assert got["downsampled"]["downsampled"] is True
    assert got["detail"] == expected["detail"]
    assert got == expected
    (summary,) = [r for r in wire.get_ok(server, "/api/runs") if r["id"] == by_columns]
    last = 39 if order == "in order" else 50_000
    assert (summary["last_step"], summary["last_epoch"]) == (last, 0)


def test_a_step_sent_again_reads_as_its_last_version_either_way(gradwatch_server, wire):
    """A step stored twice (a resumed trainer re-sends it): records and columns mixed
    in every order read back as the same records sent alike."""
    server = gradwatch_server()
    first = [wire.step(s) for s in range(6)]
    again = [wire.step(s, params=4, loss=9.0 + s) for s in range(3, 9)]
    for s, record in enumerate(again):
        record["param_norms"] = {k: 100.0 + s for k in record["param_norms"]}
    runs = {}
    for label, (a, b) in {
        "records": (False, False),
        "records then columns": (False, True),
        "columns then records": (True, False),
        "columns": (True, True),
    }.items():
        run_id = runs[label] = wire.run_id()
        with wire.connect(server) as ws:
            ws.send(json.dumps(wire.hello(run_id)))
            for seq, (records, as_columns) in enumerate(((first, a), (again, b))):
                batch = wire.batch(run_id, seq, [] if as_columns else records)
                if as_columns:
                    batch["columns"] = [as_block(records)]
                ws.send(json.dumps(batch))
            assert [wire.recv(ws)["seq"] for _ in range(2)] == [0, 1]
    answers = {
        label: wire.get_ok(
            server, f"/api/runs/{run_id}/steps?fields=loss,param_norms/lstm1.weight_1"
        )
        for label, run_id in runs.items()
    }
    named = answers["records"]["fields"]["param_norms/lstm1.weight_1"]
    assert named["step"] == list(range(9))
    assert named["value"][3:] == [100.0 + s for s in range(6)]
    loss = answers["records"]["fields"]["loss"]  # a plain field alike: once a step, the last
    assert loss["step"] == list(range(9))
    assert loss["value"][3:] == [9.0 + s for s in range(3, 9)]
    assert loss["value"][:3] == [first[s]["loss"] for s in range(3)]
    for label, answer in answers.items():
        assert answer == answers["records"], label


def test_a_batch_may_mix_records_and_blocks(gradwatch_server, wire):
    server = gradwatch_server()
    heavy, light = _records(wire)
    run_id = wire.run_id()
    end = {"kind": "end", "status": "finished", "step": 39}
    batch = {**wire.batch(run_id, 0, [*light, end]), "columns": [as_block(heavy)]}
    assert _send(wire, server, run_id, batch) == {"type": "ack", "seq": 0, "live": False}
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss,rss_bytes")
    assert steps["total"] == 40
    assert steps["fields"]["loss"]["step"] == list(range(40))
    assert steps["fields"]["rss_bytes"]["step"] == list(range(0, 40))
    (summary,) = [r for r in wire.get_ok(server, "/api/runs") if r["id"] == run_id]
    assert summary["status"] == "finished"


def test_live_viewers_get_block_records_as_records(gradwatch_server, wire):
    server = gradwatch_server()
    heavy, light = _records(wire)
    run_id = wire.run_id()
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        batch = {**wire.batch(run_id, 0, []), "columns": [as_block(heavy[:3]), as_block(light)]}
        _send(wire, server, run_id, batch)
        message = wire.recv(viewer)
    assert message["type"] == "records"
    records = message["records"]
    # in step order, as the trainer sent them: blocks are grouped by shape (heavy steps
    # 0, 2, 4 in one, the light odd steps in another), viewers draw in arrival order
    assert [r["step"] for r in records] == sorted([0, 2, 4, *range(1, 40, 2)])
    first = records[0]
    assert first["loss"] == heavy[0]["loss"]
    assert first["param_norms"] == heavy[0]["param_norms"]
    assert first["gate_norms"] == heavy[0]["gate_norms"]
    raw = base64.urlsafe_b64decode(first["timesteps"]["lstm1"]["input"]["f64"])
    assert list(struct.unpack(f"<{len(raw) // 8}d", raw)) == heavy[0]["timesteps"]["lstm1"]["input"]
    at = {r["step"]: r for r in records}
    assert at[1]["profile"] == light[0]["profile"]
    assert [at[s]["graph_truncated"] for s in (1, 3, 5)] == [False, True, False]
    assert "timesteps" not in at[1]


def _good() -> dict[str, Any]:
    return {
        "kind": "step",
        "n": 2,
        "step": {"i64": _b64("q", [0, 1])},
        "loss": {"f64": _b64("d", [0.5, 0.25])},
        "named": {"names": ["param_norms/w", "gate_norms/w/i"], "f64": _b64("d", [1, 2, 3, 4])},
        "timesteps": {"lstm": {"input": {"len": 3, "f64": _b64("d", [0.0] * 6)}}},
    }


def _with(**changes: Any) -> dict[str, Any]:
    block = _good()
    for key, value in changes.items():
        if value is None:
            del block[key]
        else:
            block[key] = value
    return block


@pytest.mark.parametrize(
    ("block", "says"),
    [
        (
            _with(loss={"f64": _b64("d", [0.5])}),
            "columns[0].loss: expected 2 float64 values (16 bytes), got 8 bytes",
        ),
        (
            _with(step={"i64": _b64("q", [0, -1])}),
            "columns[0].step: expected integers >= 0, got -1",
        ),
        (
            _with(graph_truncated={"i64": _b64("q", [0, 2])}),
            "columns[0].graph_truncated: expected 0 or 1, got 2",
        ),
        (
            _with(named={"names": ["w"], "f64": _b64("d", [1, 2])}),
            "columns[0].named.names: expected param_norms/<parameter>, gate_norms/",
        ),
        (
            _with(named={"names": ["profile/m/speed"], "f64": _b64("d", [1, 2])}),
            "columns[0].named.names: expected profile/<module>/<forward_s, backward_s or calls>",
        ),
        (
            _with(named={"names": ["param_norms/w"], "f64": _b64("d", [1, 2, 3])}),
            "columns[0].named.f64: expected 2 float64 values (16 bytes), got 24 bytes",
        ),
        (
            _with(timesteps={"lstm": {"input": {"len": 4, "f64": _b64("d", [0.0] * 6)}}}),
            "columns[0].timesteps.lstm.input.f64: expected 8 float64 values (64 bytes), got 48",
        ),
        (_with(n=0), "columns[0].n: expected greater than or equal to 1, got 0"),
        (_with(step=None), "columns[0].step: expected a value, got nothing"),
        (
            _with(nonfinite={"parameters": ["w"]}),
            "columns[0].nonfinite: expected only the fields of a step block",
        ),
        (
            _with(epoch={"i64": "AA$A"}),
            "columns[0].epoch.i64: expected base64 of little-endian int64 values",
        ),
        (_with(loss={"f64": "AA$A"}), "columns[0].loss.f64: expected base64"),
        (_with(kind="epoch"), "columns[0].kind: expected 'step', got 'epoch'"),
    ],
)
def test_a_bad_block_is_refused_and_nothing_of_it_is_stored(
    shared_gradwatch_server, wire, block, says
):
    server = shared_gradwatch_server
    run_id = wire.run_id()
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps({**wire.batch(run_id, 0, [wire.step(100)]), "columns": [block]}))
        message, code, _ = wire.expect_error(ws)
    assert code == 1007
    assert message["type"] == "error"
    assert message["message"].startswith(says), message["message"]
    status, _, _ = wire.get(server, f"/api/runs/{run_id}/steps")
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps") if status == 200 else {"total": 0}
    assert steps["total"] == 0
    # The same block made right is taken on a new connection: the server carries on.
    good = {**wire.batch(run_id, 0, []), "columns": [_good()]}
    assert _send(wire, server, run_id, good) == {"type": "ack", "seq": 0, "live": False}


def test_too_many_records_across_records_and_columns_are_refused(shared_gradwatch_server, wire):
    server = shared_gradwatch_server
    run_id = wire.run_id()
    n = 10_000
    block = {"kind": "step", "n": n, "step": {"i64": _b64("q", list(range(n)))}}
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps({**wire.batch(run_id, 0, [wire.step(n)]), "columns": [block]}))
        message, code, _ = wire.expect_error(ws)
    assert code == 1007
    assert message["message"] == (
        "expected at most 10000 records in a batch (records and columns together), got 10001"
    )


def test_batches_committed_together_roll_up_as_batches_committed_alone(tmp_path, store_sql, wire):
    """The writer upserts the rollups of one transaction's batches once (a run's
    batches joined into one group): downsampled history reads the same as when each
    batch commits alone. A lock held on the database makes the writer queue them."""
    import sqlite3

    db = str(tmp_path / "g.db")
    store = store_sql.open(db, "alone")
    heavy, light = _records(wire)
    batches = []
    for seq in range(8):
        part = [dict(r, step=r["step"] + 40 * seq) for r in heavy + light]
        batch = wire.batch("", seq, part[::3] if seq % 2 else [])
        batch["columns"] = [as_block(part[:20]), as_block(part[20:])] if seq % 2 == 0 else []
        if seq % 2:
            batch["columns"] = [as_block([r for i, r in enumerate(part[:20]) if i % 3])]
        batches.append(batch)
    from gradwatch.server.schema import parse_message

    def parsed(run: str, batch: dict[str, Any]) -> Any:
        return parse_message(json.dumps({**batch, "run_id": run}))

    try:
        for batch in batches:
            assert store.submit_batch(parsed("alone", batch)).result()
        store.submit_hello(parse_message(json.dumps(wire.hello("together")))).result()
        blocker = sqlite3.connect(db, timeout=30)
        blocker.execute("BEGIN EXCLUSIVE")
        futures = [store.submit_batch(parsed("together", b)) for b in batches]
        blocker.rollback()
        blocker.close()
        assert all(f.result(timeout=60) for f in futures)
        for query in ({"max_points": 8}, {"max_points": 30, "start": 5, "stop": 290}, {}):
            alone, together = store.steps("alone", **query), store.steps("together", **query)
            assert alone["total"] == together["total"] > 0
            assert together["downsampled"] == ("max_points" in query)
            assert together["fields"] == alone["fields"]
    finally:
        store.close()
