"""Archiving runs (PUT /api/runs/{id}/archived): hidden from the list, readable by id,
and changed only with the ingest token, never the view token. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def put_archived(server: Any, run_id: str, body: Any, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(  # noqa: S310 - the test's own loopback server
        f"{server.http}/api/runs/{run_id}/archived",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_archived_run_leaves_the_list_and_stays_readable(gradwatch_server, gradwatch_db, wire):
    server = gradwatch_server(db=gradwatch_db)
    keep, old = wire.run_id(), wire.run_id()
    wire.send_run(server, old, [[wire.step(s) for s in range(3)]])
    wire.send_run(server, keep, [[wire.step(0)]])
    assert put_archived(server, old, {"archived": True}) == (200, {"id": old, "archived": True})
    assert put_archived(server, old, {"archived": True})[0] == 200  # idempotent
    assert [r["id"] for r in wire.get_ok(server, "/api/runs")] == [keep]
    listed = wire.get_ok(server, "/api/runs?archived=true")
    assert {r["id"]: r["archived"] for r in listed} == {keep: False, old: True}
    detail = wire.get_ok(server, f"/api/runs/{old}")
    assert detail["archived"] is True and detail["last_step"] == 2
    steps = wire.get_ok(server, f"/api/runs/{old}/steps")
    assert steps["fields"]["loss"]["step"] == [0, 1, 2]
    assert put_archived(server, old, {"archived": False})[0] == 200
    assert [r["id"] for r in wire.get_ok(server, "/api/runs")] == [keep, old]


def test_archiving_needs_the_ingest_token_and_a_known_run(gradwatch_server, wire):
    server = gradwatch_server(token="ingest-secret", view_token="view-only")
    run = wire.run_id()
    wire.send_run(server, run, [[wire.step(0)]], token="ingest-secret")
    status, body = put_archived(server, run, {"archived": True}, token="view-only")
    assert status == 401 and "expected the ingest token" in body["detail"], body
    assert put_archived(server, run, {"archived": True})[0] == 401
    status, body = put_archived(server, "no-such-run", {"archived": True}, token="ingest-secret")
    assert status == 404, body
    status, body = put_archived(server, run, {"archived": "yes"}, token="ingest-secret")
    assert status == 422, body
    assert put_archived(server, run, {"archived": True}, token="ingest-secret")[0] == 200
    assert wire.get_ok(server, "/api/runs", token="view-only") == []


def test_view_token_alone_never_changes_runs(gradwatch_server, wire):
    server = gradwatch_server(view_token="view-only")
    run = wire.run_id()
    wire.send_run(server, run, [[wire.step(0)]])
    status, body = put_archived(server, run, {"archived": True}, token="view-only")
    assert status == 403 and "--token" in body["detail"], body
    assert [r["id"] for r in wire.get_ok(server, "/api/runs", token="view-only")] == [run]
