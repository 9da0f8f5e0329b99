"""Live fan-out between replicas that share one PostgreSQL: the announce side (SQL the
writer runs in each batch's transaction) and the listen side (a thread that LISTENs).

Why LISTEN/NOTIFY and not Redis pub/sub: the replicas already share the database, so
there is no new service to run, secure and monitor, and a notification is sent only
when the transaction that stored the batch commits (never for a rolled-back batch,
never before its rows are readable by the other replicas).

A NOTIFY payload is limited to 8000 bytes, smaller than one batch can be, so the
writer stores each batch as the writer process's frame (store/handoff.py: its blocks
as raw bytes; a replica with viewers turns it into the live message's records, the
writer does no JSON) in the UNLOGGED table ``live_batches``, kept ``RETAIN_S``
seconds, and notifies a pointer:
``{"r": replica, "id": row id, "run": run_id, "u": urgent}``, or
``{"r": replica, "run": run_id, "hello": true}`` for a trainer's hello. Every replica
LISTENs on one channel per schema (:func:`channel_for`) and ignores its own ``r``.

Example (what a replica does at startup; ``deliver`` is called on the listen thread):
    >>> listener = Listener(url, channel, replica, deliver=print)  # doctest: +SKIP
    >>> listener.start()     # returns once LISTEN is in place      # doctest: +SKIP
    >>> listener.stop()                                             # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger("gradwatch.server")

# Rows of live_batches older than this are deleted: a replica whose LISTEN connection
# was away for longer cannot catch up from the table (its viewers are told "lagged").
RETAIN_S = 300.0
# How often a writer deletes expired rows (seconds).
PRUNE_EVERY_S = 30.0
# The application_name of listen connections (pg_stat_activity) starts with this,
# followed by the channel: an operator sees which deployment a listener serves.
APP_NAME = "gradwatch-live"
# Seconds between liveness queries on an idle LISTEN connection.
PING_EVERY_S = 5.0

LIVE_TABLE = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS live_batches (id BIGSERIAL PRIMARY KEY,"
    " replica TEXT NOT NULL, run_id TEXT NOT NULL, rank BIGINT NOT NULL, seq BIGINT NOT NULL,"
    " urgent BOOLEAN NOT NULL, frame BYTEA NOT NULL,"
    " created TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
)
# No compression of the frames: pglz on 300 KB of a batch took 17 ms, storing it
# plainly 1.3 ms; the rows live 5 minutes and are never read by history.
LIVE_STORAGE = "ALTER TABLE live_batches ALTER COLUMN frame SET STORAGE EXTERNAL"
LIVE_INDEX = "CREATE INDEX IF NOT EXISTS live_batches_created ON live_batches (created)"
# One statement per transaction: store its batches, then queue a pointer to each, in
# the order they were stored (sent at COMMIT).
ANNOUNCE_BATCHES = (
    "WITH row AS (INSERT INTO live_batches (replica, run_id, rank, seq, urgent, frame)"
    " SELECT %s, r, k, s, u, f FROM unnest(%s::text[], %s::bigint[], %s::bigint[],"
    " %s::boolean[], %b::bytea[]) AS b(r, k, s, u, f) RETURNING id, run_id, urgent)"
    " SELECT pg_notify(%s, json_build_object('r', %s::text, 'id', id, 'run', run_id,"
    " 'u', urgent)::text) FROM (SELECT * FROM row ORDER BY id) AS stored"
)
ANNOUNCE_HELLO = (
    "SELECT pg_notify(%s, json_build_object('r', %s::text, 'run', %s::text, 'hello', true)::text)"
)
PRUNE = "DELETE FROM live_batches WHERE created < clock_timestamp() - make_interval(secs => %s)"


def channel_for(schema: str) -> str:
    """The NOTIFY channel of the replicas that share ``schema`` (channels are per
    database, so deployments in different schemas of one database must not mix).

    >>> channel_for("public")
    'gradwatch_live_public'
    >>> len(channel_for("x" * 80)) <= 63
    True
    """
    name = f"gradwatch_live_{schema}"
    if len(name.encode()) <= 63:  # PostgreSQL truncates identifiers at 63 bytes
        return name
    return "gradwatch_live_" + hashlib.sha256(schema.encode()).hexdigest()[:40]


Delivery = tuple[str, Any]
"""``("note", payload dict)`` for another replica's notification, or ``("resync",
seconds)`` after the LISTEN connection came back: what may have been missed is what
was stored in the last ``seconds``."""


class Listener:
    """A daemon thread holding one autocommit connection that LISTENs on ``channel``.

    It hands every notification of another replica to ``deliver`` (on this thread), and
    reconnects when the connection drops (backoff 50 ms doubling to 5 s), then delivers
    ``("resync", seconds)`` so the receiver can read back what it missed.
    """

    def __init__(
        self, url: str, channel: str, replica: str, deliver: Callable[[Delivery], None]
    ) -> None:
        self.url = url
        self.channel = channel
        self.replica = replica
        self.deliver = deliver
        self.reconnects = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._warned: set[str] = set()
        # When the connection was last known to be listening (None: never yet).
        self._last_ok: float | None = None
        self._thread = threading.Thread(target=self._run, name="gradwatch-live-listen", daemon=True)

    @property
    def application_name(self) -> str:
        return f"{APP_NAME} {self.channel}"[:63]

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread; return once LISTEN is in place (TimeoutError otherwise)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"expected LISTEN {self.channel} within {timeout} s, got no answer")

    def stop(self) -> None:
        """End the thread (within about half a second). Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _warn_once(self, kind: str, error: BaseException) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("gradwatch live across replicas: %s: %s", kind, error)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self.url, autocommit=True, application_name=self.application_name
                )
            except Exception as error:
                self._warn_once("cannot connect to listen", error)
                self._stop.wait(backoff)  # a backoff between attempts, not synchronisation
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                with conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    if self._last_ok is not None:
                        self.reconnects += 1
                        # Margin: a batch committed just before the drop may not have
                        # been delivered yet when _last_ok was taken.
                        self.deliver(("resync", time.monotonic() - self._last_ok + 5.0))
                    self._ready.set()
                    backoff = 0.05
                    self._listen(conn)
            except Exception as error:
                self._warn_once("the LISTEN connection dropped; reconnecting", error)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        """Deliver notifications until stopped; raises when the connection is lost."""
        self._last_ok = pinged = time.monotonic()
        while not self._stop.is_set():
            for note in conn.notifies(timeout=0.5):
                self._hand(note.payload)
            now = time.monotonic()
            if now - pinged > PING_EVERY_S:  # a dead peer does not always close the socket
                conn.execute("SELECT 1")
                pinged = now
            self._last_ok = now

    def _hand(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            # Anyone who may connect can NOTIFY this channel: take only the shapes above.
            if (
                not isinstance(note, dict)
                or not isinstance(note.get("run"), str)
                or ("id" in note and type(note["id"]) is not int)
            ):
                raise ValueError(
                    f"expected a JSON object with run (and an integer id), got {payload[:80]!r}"
                )
        except ValueError as error:
            self._warn_once("an unreadable notification", error)
            return
        if note.get("r") == self.replica:
            return  # this replica's own batch: its viewers got it on the local fast path
        self.deliver(("note", note))
