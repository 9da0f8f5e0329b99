"""Two `gradwatch serve` replicas on one PostgreSQL schema (issue #7): a viewer on
replica B sees live what a trainer sends to replica A (LISTEN/NOTIFY), a viewer on A
gets each batch once, and B catches up after its LISTEN connection was cut."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

pytestmark = pytest.mark.postgres



def _batches(count: int) -> list[list[dict[str, Any]]]:
    from tests.server.conftest import Wire

    out = [
        [Wire.step(2 * i), Wire.step(2 * i + 1, loss="NaN" if i == 3 else 0.5)]
        for i in range(count)
    ]
    out[-1].append({"kind": "end", "status": "finished", "step": 2 * count - 1})
    return out


def _next_of(wire: Any, viewer: Any, kind: str, deadline: float) -> dict[str, Any]:
    """The viewer's next message of type `kind` (others skipped), within the deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {kind!r} message before the deadline")
        message = wire.recv(viewer, timeout=left)
        if message["type"] == kind:
            return message


def _notify(db: str, schema: str, payloads: list[str]) -> None:
    import psycopg

    from gradwatch.server.store.postgres import channel_for

    with psycopg.connect(db, autocommit=True) as conn:
        for payload in payloads:
            conn.execute("SELECT pg_notify(%s, %s)", (channel_for(schema), payload))


def test_viewer_on_replica_b_sees_live_each_batch_sent_to_replica_a(
    gradwatch_server, shared_schema, wire
):
    db, schema = shared_schema
    a = gradwatch_server(db=db)
    b = gradwatch_server(db=db)
    run_id = wire.run_id()
    batches = _batches(12)
    with (
        wire.connect(b, f"/ws/live?run={run_id}") as viewer,
        wire.connect(b, "/ws/live") as runs,
        wire.connect(a) as trainer,
    ):
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        assert wire.recv(runs) == {"type": "subscribed", "run_id": None}
        # Anyone who can connect may NOTIFY the channel: junk is ignored, not relayed.
        _notify(db, schema, ["not json", "[1]", json.dumps({"run": run_id, "id": "1"})])
        trainer.send(json.dumps(wire.hello(run_id, run="across-replicas")))
        # The runs list of B shows the new run, from A's hello.
        first = _next_of(wire, runs, "run", time.monotonic() + 30)
        assert (first["run"]["id"], first["run"]["name"]) == (run_id, "across-replicas")
        for seq, records in enumerate(batches):
            trainer.send(json.dumps(wire.batch(run_id, seq, records)))
            # A's acks say the run is watched: its viewer is on B
            assert wire.recv(trainer) == {"type": "ack", "seq": seq, "live": True}
            # Live: B's viewer has this batch before the trainer sends the next one.
            message = wire.recv(viewer, timeout=30)
            assert message == {
                "type": "records",
                "run_id": run_id,
                "rank": 0,
                "seq": seq,
                "records": records,
            }
        # The end record reaches B's runs list too (summaries read from the database).
        deadline = time.monotonic() + 30
        status = first["run"]["status"]
        while status != "finished":
            summary = _next_of(wire, runs, "run", deadline)["run"]
            assert summary["id"] == run_id
            status = summary["status"]
        assert summary["last_step"] == 2 * len(batches) - 1


def test_viewer_on_replica_a_gets_each_batch_once(gradwatch_server, shared_schema, wire):
    db, _ = shared_schema
    a = gradwatch_server(db=db)
    b = gradwatch_server(db=db)
    run_id = wire.run_id()
    batches = _batches(10)
    with (
        wire.connect(a, f"/ws/live?run={run_id}") as on_a,
        wire.connect(b, f"/ws/live?run={run_id}") as on_b,
    ):
        assert wire.recv(on_a)["type"] == wire.recv(on_b)["type"] == "subscribed"
        wire.send_run(a, run_id, batches)
        # A marker batch (rank 1) through B, after every batch of rank 0 was stored: A's
        # listener handles notifications in commit order, so a duplicate of any rank-0
        # batch would reach A's viewer before the marker does.
        with wire.connect(b) as other:
            other.send(json.dumps(wire.hello(run_id, rank=1, world_size=2)))
            other.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)], rank=1)))
            assert wire.recv(other) == {"type": "ack", "seq": 0, "live": True}
        for viewer in (on_a, on_b):
            seen: list[tuple[int, int]] = []
            deadline = time.monotonic() + 30
            while (1, 0) not in seen:
                message = _next_of(wire, viewer, "records", deadline)
                seen.append((message["rank"], message["seq"]))
            assert [s for r, s in seen if r == 0] == list(range(len(batches)))
            assert seen[-1] == (1, 0)


def test_replica_catches_up_after_its_listen_connection_was_cut(
    gradwatch_server, shared_schema, postgres_url, wire
):
    import psycopg

    db, _ = shared_schema
    # B logs in as its own role, so the test can cut B's LISTEN connection and keep it
    # from coming back while A stores batches, then let it back in.
    role = "gw_b_" + uuid.uuid4().hex[:8]
    parts = urlsplit(db)
    b_db = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} SUPERUSER LOGIN")
        a = b = None
        try:
            a = gradwatch_server(db=db)
            b = gradwatch_server(db=b_db)
            run_id = wire.run_id()
            batches = _batches(8)
            with wire.connect(b, f"/ws/live?run={run_id}") as viewer:
                assert wire.recv(viewer)["type"] == "subscribed"
                wire.send_run(a, run_id, batches[:2])
                for seq in (0, 1):
                    assert wire.recv(viewer, timeout=30)["seq"] == seq
                admin.execute(f"ALTER ROLE {role} NOLOGIN")
                cut = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE usename = %s AND application_name LIKE 'gradwatch-live %%'",
                    (role,),
                ).fetchall()
                assert cut == [(True,)], f"expected B's one listen connection, got {cut}"
                # Stored while B cannot listen: no notification reaches B.
                wire.send_run(a, run_id, batches[2:6], first_seq=2)
                admin.execute(f"ALTER ROLE {role} LOGIN")
                # Back in, B reads what it missed from the database, then goes on live.
                for seq in range(2, 6):
                    message = wire.recv(viewer, timeout=60)
                    assert (message["type"], message["seq"]) == ("records", seq)
                    assert message["records"] == batches[seq]
                wire.send_run(a, run_id, batches[6:], first_seq=6)
                for seq in range(6, len(batches)):
                    assert wire.recv(viewer, timeout=30)["seq"] == seq
        finally:
            for server in (a, b):
                if server is not None:
                    server.stop()  # B's connections must end before its role is dropped
            admin.execute(f"DROP ROLE IF EXISTS {role}")
