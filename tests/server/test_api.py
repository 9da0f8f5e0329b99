"""The REST history API (docs/API.md) on a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time


def test_health_names_protocol_and_backend(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    health = wire.get_ok(server, "/api/health")
    assert health["status"] == "ok"
    assert health["protocol"] == 1
    assert health["db"] == ("postgresql" if gradwatch_db.startswith("postgresql") else "sqlite")


def test_openapi_schema_is_published(shared_gradwatch_server, wire):
    schema = wire.get_ok(shared_gradwatch_server, "/openapi.json")
    for path in (
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/steps",
        "/api/runs/{run_id}/timesteps",
        "/api/runs/{run_id}/depth",
        "/api/runs/{run_id}/update_ratios",
        "/api/runs/{run_id}/alerts",
        "/api/health",
    ):
        assert path in schema["paths"], path


def test_runs_list_summarises_each_run_newest_first(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    old, new = wire.run_id(), wire.run_id()
    wire.send_run(
        server, old, [[wire.step(0), wire.step(1)], [{"kind": "end", "status": "crashed"}]]
    )
    alert = {
        "kind": "alert",
        "step": 3,
        "code": "vanishing",
        "severity": "warning",
        "subject": "lstm1",
        "message": "m",
        "hint": "h",
        "evidence": {"horizon": 20},
    }
    wire.send_run(server, new, [[wire.step(s) for s in range(4)] + [alert, alert]])
    runs = wire.get_ok(server, "/api/runs")
    assert [r["id"] for r in runs] == [new, old]
    latest = runs[0]
    assert latest["name"] == "test-run"
    assert latest["ranks"] == [0]
    assert latest["world_size"] == 1
    assert latest["last_step"] == 3
    assert latest["alerts"] == 2
    assert latest["recurrent"] == ["lstm1", "lstm2"]
    assert latest["host"] == "test-box"
    assert latest["status"] == "live"  # wrote within the last 60 s
    assert runs[1]["status"] == "crashed"
    assert latest["started"] >= runs[1]["started"]


def test_run_detail_lists_modules_series_and_parameters(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    profile = {"lstm1": {"forward_s": 0.1, "backward_s": 0.2, "calls": 25}}
    wire.send_run(server, run_id, [[wire.step(0, params=2, profile=profile)]])
    detail = wire.get_ok(server, f"/api/runs/{run_id}")
    assert detail["modules"] == {"lstm1": "LSTM", "lstm2": "GRU"}
    assert detail["series"] == {"lstm1": ["input"], "lstm2": ["input"]}
    assert detail["parameters"] == ["lstm1.weight_0", "lstm1.weight_1"]
    assert detail["gate_parameters"] == ["lstm1.weight_hh_l0"]
    assert detail["hello"]["0"]["pid"] == 4242
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps")
    assert "gate_norms/lstm1.weight_hh_l0/f" in steps["fields"]
    assert steps["fields"]["profile/lstm1/calls"]["value"] == [25]
    assert steps["fields"]["param_norms/lstm1.weight_1"]["step"] == [0]


def test_steps_are_downsampled_to_max_points_and_keep_spikes(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    n = 3000
    losses = [1.0] * n
    losses[1234] = 1e6  # one spike
    losses[2345] = "NaN"  # one non-finite step
    records = [{"kind": "step", "step": s, "loss": losses[s]} for s in range(n)]
    wire.send_run(server, run_id, [records[i : i + 1000] for i in range(0, n, 1000)])
    answer = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss&max_points=100")
    loss = answer["fields"]["loss"]
    assert answer["total"] == n and answer["downsampled"] is True
    assert len(loss["step"]) <= 100
    assert loss["step"] == sorted(loss["step"])
    assert 1e6 in loss["value"] and "NaN" in loss["value"]
    window = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss&from=1000&to=1099")
    assert window["fields"]["loss"]["step"] == list(range(1000, 1100))
    assert window["downsampled"] is False


def test_timesteps_matrix_keeps_the_latest_row(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    wire.send_run(server, run_id, [[wire.step(s, length=8 + s % 3) for s in range(50)]])
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1&max_steps=7")
    assert len(heat["steps"]) == 7
    assert heat["steps"][0] == 0 and heat["steps"][-1] == 49
    assert [len(row) for row in heat["values"]] == [8 + s % 3 for s in heat["steps"]]
    assert heat["max_timesteps"] == 10
    expected = wire.step(49, length=8 + 49 % 3)["timesteps"]["lstm1"]["input"]
    assert heat["values"][-1] == expected


def test_epochs_and_alerts_come_back_in_order_with_rank(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    records = [
        {"kind": "epoch", "epoch": 0, "step": 9, "duration_s": 1.5, "steps": 10},
        {
            "kind": "alert",
            "step": 5,
            "code": "graph_growth",
            "severity": "error",
            "subject": "lstm1",
            "message": "m1",
            "hint": "detach",
            "evidence": {"n": [1, 2]},
        },
        {
            "kind": "alert",
            "step": 9,
            "code": "graph_growth",
            "state": "cleared",
            "subject": "lstm1",
        },
        {"kind": "epoch", "epoch": 1, "step": 19, "duration_s": 2.5, "steps": 10},
    ]
    wire.send_run(server, run_id, [records])
    epochs = wire.get_ok(server, f"/api/runs/{run_id}/epochs")
    assert [(e["epoch"], e["duration_s"]) for e in epochs] == [(0, 1.5), (1, 2.5)]
    alerts = wire.get_ok(server, f"/api/runs/{run_id}/alerts")
    assert [(a["step"], a["state"], a["rank"]) for a in alerts] == [
        (5, "raised", 0),
        (9, "cleared", 0),
    ]
    assert alerts[0]["evidence"] == {"n": [1, 2]}
    assert alerts[0]["hint"] == "detach"


def test_alerts_of_one_rank_are_that_ranks_only(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    # Each rank's alerts name their own step and subject, sent rank 1 first, then
    # rank 0, then rank 1 again: arrival order differs from rank order.
    sent = {0: [(3, "lstm0")], 1: [(7, "cell1"), (11, "cell1b")]}
    for rank, seq, which in ((1, 0, slice(0, 1)), (0, 0, slice(0, 1)), (1, 1, slice(1, 2))):
        records = [
            {"kind": "alert", "step": step, "code": "vanishing", "severity": "warning",
             "subject": subject, "message": f"rank {rank}"}
            for step, subject in sent[rank][which]
        ]  # fmt: skip
        with wire.connect(server) as ws:
            ws.send(json.dumps(wire.hello(run_id, rank=rank, world_size=2)))
            ws.send(json.dumps(wire.batch(run_id, seq, records, rank=rank)))
            assert wire.recv(ws) == {"type": "ack", "seq": seq, "live": False}
    every = wire.get_ok(server, f"/api/runs/{run_id}/alerts")
    assert [(a["rank"], a["step"], a["subject"]) for a in every] == [
        (1, 7, "cell1"),
        (0, 3, "lstm0"),
        (1, 11, "cell1b"),
    ]
    for rank, expected in sent.items():
        got = wire.get_ok(server, f"/api/runs/{run_id}/alerts?rank={rank}")
        assert [(a["rank"], a["step"], a["subject"]) for a in got] == [
            (rank, step, subject) for step, subject in expected
        ]
        assert {a["message"] for a in got} == {f"rank {rank}"}
    assert wire.get_ok(server, f"/api/runs/{run_id}/alerts?rank=2") == []


def test_unknown_run_is_404_and_bad_field_is_422(shared_gradwatch_server, wire):
    status, body, _ = wire.get(shared_gradwatch_server, "/api/runs/no-such-run/steps")
    assert status == 404
    assert body["detail"] == "expected a known run id, got 'no-such-run'"
    run_id = wire.run_id()
    wire.send_run(shared_gradwatch_server, run_id, [[wire.step(0)]])
    status, body, _ = wire.get(shared_gradwatch_server, f"/api/runs/{run_id}/steps?fields=weights")
    assert status == 422
    assert body["detail"].startswith("fields: expected loss, duration_s")
    assert body["detail"].endswith("got 'weights'")
    status, body, _ = wire.get(shared_gradwatch_server, f"/api/runs/{run_id}/steps?max_points=1")
    assert status == 422
    assert "max_points" in body["detail"] and "got '1'" in body["detail"]
    for path, name in ((f"/api/runs/{run_id}/timesteps", "module"),
                       (f"/api/runs/{run_id}/depth", "stack")):
        status, body, _ = wire.get(shared_gradwatch_server, path)
        assert status == 422
        assert body["detail"] == f"{name}: expected a value (a required parameter), got none"


def test_html_in_names_is_returned_as_plain_text(shared_gradwatch_server, wire):
    run_id = wire.run_id()
    name = "<script>alert(1)</script>"
    with wire.connect(shared_gradwatch_server) as ws:
        import json

        ws.send(json.dumps(wire.hello(run_id, run=name)))
        ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)])))
        wire.recv(ws)
    status, body, headers = wire.get(shared_gradwatch_server, f"/api/runs/{run_id}")
    assert status == 200
    assert body["name"] == name  # stored and returned verbatim, as JSON text
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"


def test_run_is_live_while_connected_then_stale(gradwatch_server, wire):
    import json

    # Stale as soon as no trainer is connected (instead of 60 s after the last write).
    server = gradwatch_server(env={"GRADWATCH_STALE_AFTER_S": "0"})
    run_id = wire.run_id()
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)])))
        assert wire.recv(ws)["seq"] == 0
        assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "live"
    # The server notices the closed socket on its own; poll for it (bounded).
    import time

    deadline = time.monotonic() + 30
    while wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "live":
        assert time.monotonic() < deadline, "the run never became stale"
        time.sleep(0.05)  # poll interval of a bounded wait, not synchronisation
    assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "stale"


def test_health_reports_a_store_that_does_not_answer_as_503_with_the_reason(
    gradwatch_server, postgres_url, shared_schema, wire
):
    import psycopg

    url, schema = shared_schema
    server = gradwatch_server(db=url)
    assert wire.get(server, "/api/health")[0] == 200
    with psycopg.connect(postgres_url) as conn:  # a transaction that holds the runs table
        conn.execute(f"LOCK TABLE {schema}.runs IN ACCESS EXCLUSIVE MODE")
        status, body, headers = wire.get(server, "/api/health")
        assert status == 503 and headers["content-type"].startswith("application/json")
        assert body["status"] == "unavailable"
        assert "did not answer within 2 s" in body["reason"]
        conn.rollback()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and wire.get(server, "/api/health")[0] != 200:
        time.sleep(0.05)  # polling a condition with a deadline
    assert wire.get(server, "/api/health")[1]["status"] == "ok"
