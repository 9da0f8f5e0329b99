"""Names and values the server cannot store as sent: shortened, left out or refused for
good, never retried forever (issue 18, items 1 and 2). Real servers, real websockets,
SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from websockets.exceptions import ConnectionClosed

from gradwatch.protocol.names import short_name
from gradwatch.protocol.sender import WebSocketSink
from gradwatch.server.store.base import StoreDataError, store_error
from gradwatch.trainer_hooks import watch

BIG = 2**63  # one past int64


class LongNames(nn.Module):
    """An LSTM under a 300-character attribute: its parameters' names pass 256."""

    def __init__(self, name: str) -> None:
        super().__init__()
        setattr(self, name, nn.LSTM(3, 5))
        self.head = nn.Linear(5, 1)
        self.lstm_name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = getattr(self, self.lstm_name)(x)
        return self.head(out)


def test_long_names_never_lose_a_run(
    gradwatch_server: Callable[..., Any], wire: Any, tmp_path: Path
) -> None:
    server = gradwatch_server()
    module = "deep_" + "x" * 295
    param = module + ".weight_ih_l0"
    run = "run-" + "r" * 296
    torch.manual_seed(0)
    model = LongNames(module)
    monitor = watch(model, run=run, server=server.url, spool=tmp_path / "out.jsonl",
                    every=1, diagnose=False)
    for _ in range(40):
        loss = model(torch.randn(6, 2, 3)).pow(2).mean()
        loss.backward()
        monitor.step(loss)
    assert monitor.close(timeout=60) is True
    run_id = monitor.run_id
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")
    assert steps["fields"]["loss"]["step"] == list(range(40))
    detail = wire.get_ok(server, f"/api/runs/{run_id}")
    assert detail["name"] == short_name(run) and len(detail["name"]) == 256
    # The hello's recurrent list and the records' names shorten alike.
    assert detail["recurrent"] == [short_name(module)]
    full = detail["hello"]["0"]["model"]["full_names"]
    assert full[short_name(param)] == param and full[short_name(run)] == run
    field = f"param_norms/{short_name(param)}"
    norms = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields={field}")
    assert norms["fields"][field]["step"] == list(range(40))
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module={short_name(module)}")
    assert heat["steps"] == list(range(40)) and heat["max_timesteps"] == 6
    assert not (tmp_path / "out.rejected.jsonl").exists()


def test_a_bad_field_is_left_out_with_a_notice_and_the_rest_is_stored(
    gradwatch_server: Callable[..., Any], gradwatch_db: str, wire: Any
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    records = [
        wire.step(0, rss_bytes=2**64, graph_nodes=BIG),
        wire.step(1, param_norms={"ok": 1.5, "bad\u0000name": 2.0}),
        {"kind": "alert", "step": 1, "code": "vanishing", "subject": "lstm1",
         "message": "ends in NUL\u0000"},
        wire.step(2, loss=0.25),
    ]
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, records)))
        ack = wire.recv(ws)
    assert ack["type"] == "ack" and ack["seq"] == 0
    notice = ack["notice"]
    for part in ("records[0].rss_bytes", "records[0].graph_nodes", "records[1].param_norms",
                 "records[2].message"):
        assert part in notice, notice
    fields = "loss,rss_bytes,graph_nodes,param_norms/lstm1.weight_0"
    got = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields={fields}")["fields"]
    assert got["loss"]["step"] == [0, 1, 2] and got["loss"]["value"][2] == 0.25
    assert got["rss_bytes"]["step"] == [1, 2]
    assert got["graph_nodes"]["step"] == [1, 2]
    assert got["param_norms/lstm1.weight_0"]["step"] == [0, 2]
    alerts = wire.get_ok(server, f"/api/runs/{run_id}/alerts")
    assert [(a["code"], a["subject"]) for a in alerts] == [("vanishing", "lstm1")]


WRONG_FIELDS = [
    # (field, wrong value, what the notice says): each in a record of its own
    ("loss", "0.5", "records[0].loss: expected a number"),
    ("param_norms", [1.5, 2.0], "records[1].param_norms: expected an object, got [1.5, 2.0]"),
    ("graph_nodes", -3, "records[2].graph_nodes: expected greater than or equal to 0"),
    ("timesteps", {"lstm1": {"input": "abc"}}, "records[3].timesteps.lstm1.input: expected"),
    ("gate_norms", {"lstm1.weight_hh_l0": {"i": None}}, "records[4].gate_norms"),
    ("rss_bytes", 1.5, "records[5].rss_bytes: expected a valid integer, got 1.5"),
]


def test_one_wrong_field_costs_only_itself_and_the_ack_says_which(
    gradwatch_server: Callable[..., Any], gradwatch_db: str, wire: Any
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    records = [wire.step(i, **{name: value}) for i, (name, value, _) in enumerate(WRONG_FIELDS)]
    records.append({"kind": "epoch", "epoch": 0, "step": 6, "steps": "six"})
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, records)))
        ack = wire.recv(ws)
    assert ack["type"] == "ack" and ack["seq"] == 0, ack
    for _, _, says in WRONG_FIELDS:
        assert says in ack["notice"], (says, ack["notice"])
    assert "records[6].steps: expected a valid integer, got 'six'" in ack["notice"]
    assert ack["notice"].count("the field was left out") == len(WRONG_FIELDS) + 1
    n = len(WRONG_FIELDS)
    fields = "loss,total_norm,graph_nodes,rss_bytes,param_norms/lstm1.weight_0"
    got = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields={fields}")["fields"]
    everywhere = list(range(n))
    # every record is stored; only the one wrong field of each is missing
    assert got["total_norm"]["step"] == everywhere
    assert got["loss"]["step"] == [s for s in everywhere if s != 0]
    assert got["loss"]["value"][0] == 1.0 / 2  # step 1's own loss, as sent
    assert got["param_norms/lstm1.weight_0"]["step"] == [s for s in everywhere if s != 1]
    assert got["graph_nodes"]["step"] == [s for s in everywhere if s != 2]
    assert got["rss_bytes"]["step"] == [s for s in everywhere if s != 5]
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1")
    assert heat["steps"] == [s for s in everywhere if s != 3]
    (epoch,) = wire.get_ok(server, f"/api/runs/{run_id}/epochs")
    assert epoch["epoch"] == 0 and epoch.get("steps") is None


REFUSED_WHOLE = [
    ("a step record without its step", {"kind": "step", "loss": 1.0},
     "records[0].step: expected a value, got nothing"),
    ("a step given as text", {"kind": "step", "step": "7", "loss": 1.0},
     "records[0].step: expected a valid integer, got '7'"),
    ("a record without its kind", {"step": 3, "loss": 1.0}, "records[0].kind"),
    ("an alert with an unknown severity",
     {"kind": "alert", "step": 1, "code": "vanishing", "severity": "dire"},
     "records[0].severity: expected 'info', 'warning' or 'error'"),
]


@pytest.mark.parametrize(("name", "record", "says"), REFUSED_WHOLE,
                         ids=[r[0] for r in REFUSED_WHOLE])
def test_a_record_without_what_identifies_it_is_still_refused(
    shared_gradwatch_server: Any, wire: Any, name: str, record: dict[str, Any], says: str
) -> None:
    server = shared_gradwatch_server
    run_id = wire.run_id()
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0), record])))
        error, code, _ = wire.expect_error(ws)
    assert code == 1007, (code, error)
    assert says.replace("records[0]", "records[1]") in error["message"], error["message"]
    status, _, _ = wire.get(server, f"/api/runs/{run_id}/steps?fields=loss")
    assert status in (200, 404)  # the hello may or may not have created the run
    if status == 200:  # nothing of the refused batch is stored
        steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")["fields"]
        assert steps["loss"]["step"] == []


def _hello(wire: Any, run_id: str, **fields: Any) -> str:
    return json.dumps({**wire.hello(run_id), **fields})


REFUSED = [
    ("seq beyond int64", "batch", {"seq": BIG}, "seq: expected less than or equal to"),
    ("step beyond int64", "record", {"step": BIG}, "records[0].step: expected less than"),
    ("pid beyond int64 in a hello", "hello", {"pid": 2**64}, "pid: expected less than"),
    ("rank beyond int64 in a hello", "hello", {"rank": BIG}, "rank: expected less than"),
    ("NUL in the session", "hello", {"session": "s\u0000"}, "session: expected text without NUL"),
    ("NUL in the run name", "hello", {"run": "a\u0000b"}, "run: expected text without NUL"),
    ("NUL in the run id", "run_id", "a\u0000b", "run_id: expected text without NUL"),
    ("a slash in the run id", "run_id", "a/b", "run_id: expected no '/'"),
    ("the run id ..", "run_id", "..", "run_id: expected no '/'"),
]


@pytest.mark.parametrize(("name", "where", "value", "says"), REFUSED, ids=[r[0] for r in REFUSED])
def test_errors_that_always_recur_are_refused_with_their_reason(
    gradwatch_server: Callable[..., Any], gradwatch_db: str, wire: Any,
    name: str, where: str, value: Any, says: str,
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id = value if where == "run_id" else wire.run_id()
    hello = _hello(wire, run_id, **(value if where == "hello" else {}))
    batch = wire.batch(run_id, 0, [{**wire.step(0), **(value if where == "record" else {})}])
    batch.update(value if where == "batch" else {})
    with wire.connect(server) as ws:
        ws.send(hello)
        with contextlib.suppress(ConnectionClosed):  # a refused hello may close first
            ws.send(json.dumps(batch))
        error, code, reason = wire.expect_error(ws)
    assert code == 1007 and error["code"] == 1007, (code, error)
    assert says in error["message"], error["message"]
    assert reason
    status, _, _ = wire.get(server, "/api/runs")
    assert status == 200
    # The server is fine afterwards: a good run on a fresh connection is stored.
    good = wire.run_id()
    acks = wire.send_run(server, good, [[wire.step(0)]])
    assert acks == [{"type": "ack", "seq": 0, "live": False}]


def test_a_sender_and_a_monitor_say_when_the_server_left_something_out(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    hello = {"type": "hello", "protocol": 1, "run_id": "left-out", "rank": 0}
    sink = WebSocketSink(server.url, hello, spool=tmp_path / "s.jsonl", columns=False)
    try:
        sink.send([{"kind": "step", "step": 0, "loss": 1.0, "rss_bytes": 2**64}])
        assert sink.flush(timeout=30)
        stats = sink.stats()
        assert stats["acked_batches"] == 1 and stats["repaired_batches"] == 1
        assert sink.refused == 1
    finally:
        sink.close(timeout=10)
    model = nn.Linear(2, 1)
    monitor = watch(model, run="r", server=server.url, spool=tmp_path / "m.jsonl",
                    every=1, diagnose=False)
    model(torch.randn(3, 2)).sum().backward()
    monitor.step()
    # What no trainer of ours sends, through the monitor's own sink: a count past int64.
    monitor._pipeline.sink.send([{"kind": "step", "step": 5, "graph_nodes": BIG}])
    assert monitor.close(timeout=30) is False


def test_store_faults_about_values_are_told_apart_from_transient_ones(
    postgres_url: str,
) -> None:
    import psycopg

    with psycopg.connect(postgres_url) as conn, pytest.raises(psycopg.Error) as nul:
        conn.execute("SELECT %s::text", ("a\u0000b",))
    assert isinstance(store_error(nul.value), StoreDataError)
    with psycopg.connect(postgres_url) as conn, pytest.raises(psycopg.Error) as big:
        conn.execute("SELECT %s::bigint", (BIG,))
    assert isinstance(store_error(big.value), StoreDataError)
    assert isinstance(store_error(OverflowError("int too big")), StoreDataError)
    lost = store_error(psycopg.OperationalError("server closed the connection"))
    assert not isinstance(lost, StoreDataError)
