"""PostgreSQL stores a batch's live frame for other replicas only while one of them has
a run's viewer (``live_replicas``, store/postgres.py): none is stored for a single
server, and a viewer joining on another replica mid-run misses nothing between the
history it reads and what reaches it live (its registration waits for every write
transaction in flight, and happens before it is told ``subscribed``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytestmark = pytest.mark.postgres

# pg_locks rows of an exclusive advisory lock that waits, in this database.
WAITING = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock'"
    " AND NOT granted AND database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database())"
)


def _sql(db: str, text: str, params: tuple[Any, ...] = ()) -> Any:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute(text, params).fetchone()[0]


def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll a condition of the database (not a sleep standing in for one)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {what} within {timeout} s")
        time.sleep(0.02)  # poll interval


def _steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r["kind"] == "step"]


def test_single_replica_stores_no_frames_and_its_viewer_gets_every_batch(
    gradwatch_server, shared_schema, wire
):
    db, _ = shared_schema
    a = gradwatch_server(db=db)
    acks = wire.send_run(a, wire.run_id(), [[wire.step(2 * i)] for i in range(5)])
    assert [(ack["seq"], ack["live"]) for ack in acks] == [(seq, False) for seq in range(5)]
    assert _sql(db, "SELECT count(*) FROM live_batches") == 0  # no viewer anywhere
    run_id = wire.run_id()
    batches = [[wire.step(2 * i), wire.step(2 * i + 1)] for i in range(8)]
    with wire.connect(a, f"/ws/live?run={run_id}") as viewer, wire.connect(a, "/ws/live") as runs:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        assert wire.recv(runs)["type"] == "subscribed"
        with wire.connect(a) as trainer:
            trainer.send(json.dumps(wire.hello(run_id)))
            for seq, records in enumerate(batches):
                trainer.send(json.dumps(wire.batch(run_id, seq, records)))
                assert wire.recv(trainer) == {"type": "ack", "seq": seq, "live": True}
                message = wire.recv(viewer)
                assert (message["type"], message["seq"]) == ("records", seq)
                assert message["records"] == records
        # Its own viewers take the local fast path: its registration is not "another".
        assert _sql(db, "SELECT count(*) FROM live_replicas") == 1
        assert _sql(db, "SELECT count(*) FROM live_batches") == 0


def test_viewer_joining_on_b_mid_run_gets_history_and_live_without_a_gap(
    gradwatch_server, shared_schema, wire
):
    import psycopg

    from gradwatch.server.store.postgres import LIVE_LOCK

    db, _ = shared_schema
    a = gradwatch_server(db=db)
    b = gradwatch_server(db=db)
    run_id = wire.run_id()
    total = 40
    begun, failed = threading.Event(), []
    told: list[bool] = []  # each ack's "live": does anyone watch the run?

    def train() -> None:
        try:
            with wire.connect(a) as trainer:
                trainer.send(json.dumps(wire.hello(run_id)))
                for seq in range(total):
                    records = [wire.step(2 * seq), wire.step(2 * seq + 1)]
                    trainer.send(json.dumps(wire.batch(run_id, seq, records)))
                    ack = wire.recv(trainer, timeout=60)
                    assert (ack["type"], ack["seq"]) == ("ack", seq)
                    told.append(ack["live"])
                    if seq == 4:
                        begun.set()
        except BaseException as error:
            failed.append(error)
            begun.set()
            raise

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        assert begun.wait(60) and not failed
        assert _sql(db, "SELECT count(*) FROM live_batches") == 0  # no one watched yet
        # A write transaction in flight, as a writer holds one: B's registration must
        # wait for it, and B must not say "subscribed" before it is registered.
        writer = psycopg.connect(db)
        try:
            writer.execute(f"SELECT pg_advisory_xact_lock_shared({LIVE_LOCK})")
            with wire.connect(b, f"/ws/live?run={run_id}") as viewer:
                _until(lambda: _sql(db, WAITING) == 1, "B's registration waiting for the lock")
                with pytest.raises(TimeoutError):
                    viewer.recv(timeout=0.5)  # nothing yet: "subscribed" comes after
                writer.commit()
                assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
                assert _sql(db, "SELECT count(*) FROM live_replicas") == 1
                # What the dashboard does after "subscribed": history, then live on top.
                answer = wire.get_ok(b, f"/api/runs/{run_id}/steps?fields=loss&max_points=1000000")
                history = answer["fields"]["loss"]["step"]
                live: list[int] = []
                seqs: list[int] = []
                deadline = time.monotonic() + 60
                while not seqs or seqs[-1] != total - 1:
                    message = wire.recv(viewer, timeout=max(0.1, deadline - time.monotonic()))
                    assert message["type"] == "records", message
                    seqs.append(message["seq"])
                    live += _steps(message["records"])
        finally:
            writer.close()
        trainer.join(timeout=60)
        assert not failed
        # Every batch from the first one live to the last, in order; together with the
        # history read after "subscribed", every step.
        assert seqs == list(range(seqs[0], total))
        assert sorted(set(history) | set(live)) == list(range(2 * total))
        assert _sql(db, "SELECT count(*) FROM live_batches") >= len(seqs)
        # A's acks told its trainer when a viewer on B began to watch: not before
        # (no viewer anywhere), from the batch B's viewer first got live on
        assert told[:5] == [False] * 5 and told[seqs[0]:] == [True] * (total - seqs[0]), told
    finally:
        trainer.join(timeout=60)


def test_registration_waits_for_a_write_transaction_in_flight(shared_schema):
    import psycopg

    from gradwatch.server.schema import parse_message
    from gradwatch.server.settings import Settings
    from gradwatch.server.store.postgres import LIVE_LOCK, WATCH, PostgresStore

    db, _ = shared_schema
    inside, release = threading.Event(), threading.Event()

    class Paused(PostgresStore):
        """A writer that stops inside its batch's transaction until released."""

        pause = False

        def _write_batch(self, cur: Any, batch: Any, session: str) -> bool:
            stored = super()._write_batch(cur, batch, session)
            if self.pause:
                inside.set()
                assert release.wait(30)
            return stored

    run = "run-1"
    writer = Paused(Settings(db=db))
    other = PostgresStore(Settings(db=db))
    try:
        hello = {"type": "hello", "protocol": 1, "run_id": run}
        writer.submit_hello(parse_message(json.dumps(hello))).result(30)

        def batch(seq: int) -> Any:
            message = {"type": "batch", "run_id": run, "rank": 0, "seq": seq,
                       "records": [{"kind": "step", "step": seq, "loss": 1.0}]}
            return parse_message(json.dumps(message))

        writer.pause = True
        first = writer.submit_batch(batch(0))
        assert inside.wait(30)
        writer.pause = False
        registered, seen = threading.Event(), []

        def register() -> None:
            other.watch()
            seen.append(other.query("SELECT count(*) FROM batches")[0][0])
            registered.set()

        thread = threading.Thread(target=register)
        thread.start()
        _until(lambda: _sql(db, WAITING) == 1, "the registration waiting for the lock")
        assert not registered.is_set()
        release.set()
        assert first.result(30) is True
        assert registered.wait(30)
        thread.join(30)
        # It returned after that batch committed: the batch is in what it can read.
        assert seen == [1]
        assert _sql(db, "SELECT count(*) FROM live_batches") == 0  # decided before
        assert writer.submit_batch(batch(1)).result(30) is True
        assert _sql(db, "SELECT count(*) FROM live_batches") == 1  # seen after
        # The writer's own registration does not count: its viewers are local.
        writer.watch()
        assert other.refresh_watch() is True
        other.unwatch()
        assert other.refresh_watch() is False  # gone: it must register again
        assert writer.submit_batch(batch(2)).result(30) is True
        assert _sql(db, "SELECT count(*) FROM live_batches") == 1
        # A transaction that waited for a registration sees it (it asks after the lock).
        with psycopg.connect(db) as registering:
            registering.execute(f"SELECT pg_advisory_xact_lock({LIVE_LOCK})")
            registering.execute(WATCH, ("elsewhere", 60.0))
            third = writer.submit_batch(batch(3))
            _until(lambda: _sql(db, WAITING.replace("'Exclusive", "'Share")) == 1, "the writer")
            assert not third.done()
            registering.commit()
        assert third.result(30) is True
        assert _sql(db, "SELECT count(*) FROM live_batches") == 2
    finally:
        release.set()
        writer.close()
        other.close()


def test_heartbeat_remakes_a_lapsed_registration_with_lagged_and_drops_an_unused_one(
    shared_schema,
):
    from gradwatch.server.live import RUNS_CHANNEL
    from gradwatch.server.replicas import ReplicaFeed
    from gradwatch.server.settings import Settings
    from gradwatch.server.state import AppState
    from gradwatch.server.store.postgres import PostgresStore

    db, _ = shared_schema
    store = PostgresStore(Settings(db=db))

    async def scenario() -> list[str]:
        state = AppState(store.settings, store)
        feed = ReplicaFeed(state, store)
        viewer = state.hub.subscribe("run-1")
        await feed.viewer_joins()
        assert _sql(db, "SELECT count(*) FROM live_replicas") == 1
        await feed.viewer_joins()  # fresh: nothing to do, nothing said
        assert viewer.queue.empty()
        # The row went (a crash truncates UNLOGGED tables; or it expired): the
        # heartbeat's next round registers again, then tells the viewer to repaint.
        _sql(db, "DELETE FROM live_replicas RETURNING 1")
        await feed._beat()
        assert _sql(db, "SELECT count(*) FROM live_replicas") == 1
        got = [await asyncio.wait_for(viewer.next(), 5)]
        await feed._beat()  # still watched, not lapsed: extended, nothing said
        assert viewer.queue.empty()
        # The last run viewer left (a runs-list viewer needs no frames): the row goes.
        state.hub.unsubscribe(viewer)
        runs = state.hub.subscribe(RUNS_CHANNEL)
        await feed._beat()
        assert _sql(db, "SELECT count(*) FROM live_replicas") == 0
        state.hub.unsubscribe(runs)
        return [g or "" for g in got]

    try:
        # On a thread of its own: in the whole suite the browser tests' Playwright keeps
        # an event loop running on this one, where asyncio.run() refuses to start.
        with ThreadPoolExecutor(max_workers=1) as pool:
            got = pool.submit(lambda: asyncio.run(scenario())).result(timeout=60)
        assert got == ['{"type":"lagged","dropped":1}']
    finally:
        store.close()


def test_heartbeat_rides_out_dropped_database_connections(shared_schema):
    """The database drops this replica's connections (a restart, a failover, an idle
    timeout on a proxy): the heartbeat survives, reconnects, and says ``lagged`` only
    when the registration lapsed meanwhile (other writers may then have skipped
    frames), not when it held."""
    import uuid

    from gradwatch.server.replicas import ReplicaFeed
    from gradwatch.server.settings import Settings
    from gradwatch.server.state import AppState
    from gradwatch.server.store.postgres import PostgresStore

    db, _ = shared_schema
    name = "gw_outage_" + uuid.uuid4().hex[:8]  # marks this store's connections alone
    store = PostgresStore(Settings(db=f"{db}&application_name={name}"))
    kill = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = %s"
    )
    registered = "SELECT count(*) FROM live_replicas WHERE expires > clock_timestamp()"

    async def recover(feed: Any) -> int:
        """Heartbeat rounds until one goes through; how many failed first."""
        failed = 0
        await feed._beat()
        while feed._owed:  # each failed round drops its dead connection
            failed += 1
            assert failed < 5, "the heartbeat never reconnected"
            await feed._beat()
        return failed

    async def scenario() -> tuple[int, int, list[str]]:
        state = AppState(store.settings, store)
        feed = ReplicaFeed(state, store)
        viewer = state.hub.subscribe("run-1")
        await feed.viewer_joins()
        assert _sql(db, registered) == 1
        # Connections dropped while the registration holds: nothing was missed.
        assert _sql(db, kill, (name,)) >= 1
        held = await recover(feed)
        assert viewer.queue.empty()
        assert _sql(db, registered) == 1
        # Dropped again, and the registration lapsed meanwhile: registered anew, and
        # the viewer is told to repaint from history.
        _sql(db, "UPDATE live_replicas SET expires = clock_timestamp() RETURNING 1")
        assert _sql(db, kill, (name,)) >= 1
        lapsed = await recover(feed)
        assert _sql(db, registered) == 1
        got = [await asyncio.wait_for(viewer.next(), 5)]
        assert viewer.queue.empty()
        state.hub.unsubscribe(viewer)
        return held, lapsed, [g or "" for g in got]

    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # see the test above
            held, lapsed, got = pool.submit(lambda: asyncio.run(scenario())).result(timeout=60)
        assert held >= 1 and lapsed >= 1  # the outages did reach the heartbeat
        assert got == ['{"type":"lagged","dropped":1}']
    finally:
        store.close()
