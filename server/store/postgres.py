"""PostgreSQL storage (psycopg 3): the same tables and SQL as SQLite.

One writer connection on the store's writer thread, one read connection per reading
thread. Numbers live in ``double precision`` (NaN and the infinities natively); they
leave as the protocol's strings. Use a fresh database or schema per deployment:
``postgresql://user@host/db?options=-csearch_path%3Dgw``.

Replicas that share one database see each other's batches live: a transaction
NOTIFYs its batches on the schema's channel (:func:`channel_for`) and, only while
another replica has live viewers (a row in ``live_replicas``), stores their frames in
``live_batches``; the advisory lock :data:`LIVE_LOCK` lets a registration commit only
after every transaction that may have decided "no frames". What is sent, and why no
batch falls between history and live: docs/DEPLOY.md, "How: PostgreSQL LISTEN/NOTIFY".
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from gradwatch.protocol.messages import ALERT, END, NONFINITE_STRINGS

from .. import pg_arrays
from ..columns import records_json
from ..pg_arrays import binary_array
from ..settings import Settings
from . import tables
from .base import Store
from .chunk_writes import SET_COLUMNS
from .chunks import TABLES, ColumnGroup
from .writer_process import batch_of, frame_bytes

# Rows of live_batches older than this are deleted: a replica whose LISTEN connection
# was away for longer cannot catch up from the table (its viewers are told "lagged").
RETAIN_S = 300.0
# How often a writer deletes expired rows (seconds).
PRUNE_EVERY_S = 30.0

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
# Replicas with live viewers of a run now: while a row of another replica is not
# expired, writers store their frames. Refreshed every WATCH_EVERY_S; a row that a
# replica could not refresh for WATCH_EXPIRE_S (it died, or lost the database)
# lapses, and writers stop paying for frames no one reads. Three refreshes fit in one
# expiry, so one slow or failed refresh does not lapse it (server/replicas.py).
WATCH_EVERY_S = 20.0
WATCH_EXPIRE_S = 60.0
WATCH_TABLE = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS live_replicas"
    " (replica TEXT PRIMARY KEY, expires TIMESTAMPTZ NOT NULL)"
)
# The lock between write transactions (shared) and registrations (exclusive), one per
# schema ("/live" cannot be a rollup set's key, "/<digits>", in _LOCK_SETS).
LIVE_LOCK = "hashtextextended(current_schema() || '/live', 7)"
WATCHED = (
    "SELECT EXISTS (SELECT 1 FROM live_replicas WHERE replica <> %s"
    " AND expires > clock_timestamp())"
)
# An exclusive lock waits for every transaction in flight; a wait that long means a
# stuck writer: the registration fails, and is tried again (server/replicas.py).
WATCH = (
    "INSERT INTO live_replicas (replica, expires)"
    " VALUES (%s, clock_timestamp() + make_interval(secs => %s))"
    " ON CONFLICT (replica) DO UPDATE SET expires = excluded.expires"
)
# Extends only a row that has not lapsed: one that did may have let batches go by
# without frames, so it is registered again (under the lock) and viewers repaint.
REFRESH = (
    "UPDATE live_replicas SET expires = clock_timestamp() + make_interval(secs => %s)"
    " WHERE replica = %s AND expires > clock_timestamp()"
)
# Per transaction: ids for its batches, one binary COPY of them (2-2.5x faster than
# an INSERT of a bytea[] parameter: 40 against 80-114 ms for 30 batches of 300 KB),
# then a pointer to each queued in the order they were stored (sent at COMMIT).
LIVE_IDS = (
    "SELECT nextval(pg_get_serial_sequence('live_batches', 'id')) FROM generate_series(1, %s)"
)
LIVE_COLUMNS = ("id", "replica", "run_id", "rank", "seq", "urgent", "frame")
ANNOUNCE_BATCHES = (
    "SELECT pg_notify(%s, json_build_object('r', %s::text, 'id', i, 'run', r, 'u', u)::text)"
    " FROM unnest(%s::bigint[], %s::text[], %s::boolean[]) AS b(i, r, u) ORDER BY i"
)
# A transaction without frames: the same notes, without ids (runs lists update).
ANNOUNCE_RUNS = (
    "SELECT pg_notify(%s, json_build_object('r', %s::text, 'run', r, 'u', u)::text)"
    " FROM unnest(%s::text[], %s::boolean[]) WITH ORDINALITY AS b(r, u, o) ORDER BY o"
)
ANNOUNCE_HELLO = (
    "SELECT pg_notify(%s, json_build_object('r', %s::text, 'run', %s::text, 'hello', true)::text)"
)
PRUNE = "DELETE FROM live_batches WHERE created < clock_timestamp() - make_interval(secs => %s)"
# Binary COPY of the chunk tables (store/chunks.py): each column's PostgreSQL type.
_TEXT, _BYTES = {"run_id", "fields", "notes", "family", "module", "series"}, {"steps", "data"}
_COPY_TYPES = {
    table: ["text" if c in _TEXT else "bytea" if c in _BYTES else "int8" for c in columns]
    for table, columns in TABLES.items()
}
_COPY_TYPES["live_batches"] = ["int8", "text", "text", "int8", "int8", "bool", "bytea"]
_COPY_TYPES["set_rollups"] = ["int8"] * 6 + ["bytea"]
_COPY_TYPES["series"] = ["text", "int8", "text"]
_COPY_TYPES["rollup_sets"] = ["text", "text"]
_COPY_TYPES["rollup_members"] = ["int8", "int8", "int8", "text"]
_COPY_TYPES["run_keys"] = ["text"] * 4
# The stored rollup rows of each (set, level, first block, last block).
SET_ROWS = (
    f"SELECT {', '.join('r.' + c for c in SET_COLUMNS)} FROM set_rollups r"  # noqa: S608
    " JOIN unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[]) AS q(s, l, lo, hi)"
    " ON r.set_id = q.s AND r.level = q.l AND r.block BETWEEN q.lo AND q.hi"
)
# Every batch of a transaction in one statement: the ones returned are new.
CLAIM = (
    "INSERT INTO batches (run_id, rank, session, seq, stored_at) SELECT r, k, s, q, %s"
    " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bigint[]) AS b(r, k, s, q)"
    " ON CONFLICT DO NOTHING RETURNING run_id, rank, session, seq"
)
# Transaction-level locks on rollup sets (another replica may write the same set):
# keyed by schema and id, taken in id order so two writers never wait on each other.
_LOCK_SETS = (
    "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/' || x::text, 7))"
    " FROM (SELECT x FROM unnest(%s::bigint[]) AS x ORDER BY x) AS ids"
)


class PostgresStore(Store):
    """Chosen by ``--db postgresql://...``; several servers may share one database."""

    kind: ClassVar[str] = "postgresql"
    placeholder: ClassVar[str] = "%s"
    types = ("DOUBLE PRECISION", "BIGINT", "BYTEA", "BIGSERIAL PRIMARY KEY", "")

    def __init__(self, settings: Settings) -> None:
        # Set before the writer thread starts (in Store.__init__); self.channel is set
        # by create_schema, which knows the connection's schema.
        self.replica = uuid.uuid4().hex[:16]
        self._pruned = 0.0
        # (run_id, rank, seq, urgent, frame or None) of the open transaction's batches.
        self._live_pending: list[tuple[Any, ...]] = []
        # whether the last write transaction saw another replica registered watching
        self._frames = False
        super().__init__(settings)

    @property
    def others_watching(self) -> bool:
        """Whether another replica had live viewers at the last write (it then reads
        this replica's batches back for them): acks tell trainers so."""
        return self._frames

    # ----- live viewers here: other replicas' writers store frames ---------------------
    # Each runs in a transaction of its own on this thread's read connection.
    def watch(self) -> None:
        """Register this replica's live viewers; returns once every write transaction
        that might not have seen the registration has committed (module docstring)."""
        self._own(
            ("SET LOCAL lock_timeout = '10s'", ()),
            (f"SELECT pg_advisory_xact_lock({LIVE_LOCK})", ()),
            (WATCH, (self.replica, WATCH_EXPIRE_S)),
        )

    def refresh_watch(self) -> bool:
        """Extend the registration; False when it had lapsed (or was never made)."""
        return self._own((REFRESH, (WATCH_EXPIRE_S, self.replica))) == 1

    def unwatch(self) -> None:
        """No live viewers here any more: other replicas' writers may skip frames."""
        self._own(("DELETE FROM live_replicas WHERE replica = %s", (self.replica,)))

    def live_rows(self, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """``(id, run_id, rank, seq, records, urgent)`` of stored live batches, by row
        id; the records are the JSON array a live message carries (server/columns.py)."""
        return self._live("id = ANY(?)", (list(ids),))

    def live_rows_since(self, seconds: float) -> list[tuple[Any, ...]]:
        """As :meth:`live_rows`, what other replicas stored in the last ``seconds``, in
        the order they were stored (a LISTEN connection came back)."""
        return self._live(
            "created >= clock_timestamp() - make_interval(secs => ?) AND replica <> ?",
            (seconds, self.replica),
        )

    def _live(self, where: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return [
            (*row[:4], records_json(batch_of(bytes(row[4]))), *row[5:])
            for row in self.query(
                f"SELECT id, run_id, rank, seq, frame, urgent FROM live_batches WHERE {where}"  # noqa: S608
                " ORDER BY id",
                params,
            )
        ]

    def connect(self) -> Any:
        conn = psycopg.connect(self.settings.db, autocommit=False)
        pg_arrays.register(conn.adapters)
        return conn

    def create_schema(self, conn: Any) -> None:
        with conn.cursor() as cur:
            # Serialise schema creation between servers starting at once.
            cur.execute("SELECT pg_advisory_xact_lock(4242424242)")
            cur.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema()"
            )
            found = {str(r[0]) for r in cur.fetchall()}
            cur.execute("SELECT current_schema()")
            schema = str(cur.fetchone()[0])
            where = f"PostgreSQL database {conn.info.dbname}, schema {schema}"
            tables.create_or_check(cur, where, found, self.types)
            for statement in (LIVE_TABLE, WATCH_TABLE, LIVE_STORAGE, LIVE_INDEX):
                cur.execute(statement)
            self.channel = channel_for(schema)
        conn.commit()

    # The writer thread runs these inside the transaction of the hello or batch, so the
    # notification leaves at its COMMIT, after the rows are readable by every replica.
    def _write_hello(self, cur: Any, hello: Any) -> None:
        super()._write_hello(cur, hello)
        cur.execute(ANNOUNCE_HELLO, (self.channel, self.replica, hello.run_id))

    def _begin(self, conn: Any, group: list[Any]) -> None:
        # The shared lock before any row or set lock (a registration waiting for it holds
        # later writers: one holding a lock another writer waits for would deadlock), then
        # WATCHED apart (its snapshot after the lock), then the group's batches claimed in
        # key order (two replicas never wait on each other in a cycle): one round trip.
        batches = [payload for op, payload, _ in group if op == "batch"]
        keys = sorted((b.run_id, b.rank, session, b.seq) for b, session in batches)
        lock, watched, claim = conn.cursor(), conn.cursor(), conn.cursor()
        with conn.pipeline():
            lock.execute(f"SELECT pg_advisory_xact_lock_shared({LIVE_LOCK})")
            watched.execute(WATCHED, (self.replica,))
            if keys:
                claim.execute(CLAIM, (time.time(), *map(list, zip(*keys, strict=True))))
        self._frames = bool(watched.fetchone()[0])  # whether this transaction stores frames
        new = claim.fetchall() if keys else []  # (run_id, rank, session, seq) of new batches
        self._claimed: dict[Any, bool] = dict.fromkeys(map(tuple, new), True)

    def _claim(self, cur: Any, batch: Any, session: str) -> bool:
        return self._claimed.pop((batch.run_id, batch.rank, session, batch.seq), False)

    def _write_batch(self, cur: Any, batch: Any, session: str) -> bool:
        if not super()._write_batch(cur, batch, session):
            return False
        # As ingest decides for its own viewers: the runs list updates at once.
        urgent = any(r.kind in (END, ALERT) for r in batch.records)
        frame = frame_bytes(batch, session) if self._frames else None
        self._live_pending.append((batch.run_id, batch.rank, batch.seq, urgent, frame))
        now = time.monotonic()
        if now - self._pruned > PRUNE_EVERY_S:
            self._pruned = now
            cur.execute(PRUNE, (RETAIN_S,))
        return True

    # One statement of binary arrays per table and transaction, pipelined (executemany:
    # ~20 us of CPU a row), each array built a column at a time (server/pg_arrays.py).
    # The chunks' primary key is a guard never expected to fire (a uid is unique per
    # run, rank and session).
    def _insert_rows(
        self, cur: Any, table: str, columns: Sequence[str], rows: list[Any], then: str = ""
    ) -> None:
        kinds = _COPY_TYPES[table]
        arrays = ", ".join(f"%b::{kind}[]" for kind in kinds)
        query = f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"  # noqa: S608
        columns_of = zip(*rows, strict=True)
        arrays_of = [binary_array(k, c) for k, c in zip(kinds, columns_of, strict=True)]
        cur.execute(query + then, arrays_of)

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(?)", [list(values)]

    def _set_rows_in(self, cur: Any, ranges: list[tuple[int, int, int, int]]) -> list[Any]:
        # One statement whatever the number of ranges (psycopg parses a query text of
        # hundreds of OR clauses anew each time: ~15 ms with 16 runs in a transaction).
        cur.execute(SET_ROWS, [binary_array("int8", c) for c in zip(*ranges, strict=True)])
        return list(cur.fetchall())

    # The large rows (series, live frames) by binary COPY, which pipeline mode refuses.
    def _copy(self, cur: Any, table: str, columns: Sequence[str], rows: list[Any]) -> None:
        with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(_COPY_TYPES[table])
            for row in rows:
                copy.write_row(row)

    def _discard_pending(self) -> None:
        super()._discard_pending()
        self._live_pending.clear()

    def _flush(self, cur: Any) -> None:
        if series := self._rows_pending.pop("series_chunks", None):
            self._copy(cur, "series_chunks", TABLES["series_chunks"], series)
        pending, self._live_pending = self._live_pending, []
        runs, urgent = [row[0] for row in pending], [row[3] for row in pending]
        notes: tuple[Any, ...] = (ANNOUNCE_RUNS, (self.channel, self.replica, runs, urgent))
        if pending and pending[0][4] is not None:
            cur.execute(LIVE_IDS, (len(pending),))
            ids = sorted(int(row[0]) for row in cur.fetchall())
            rows = [(i, self.replica, *row) for i, row in zip(ids, pending, strict=True)]
            self._copy(cur, "live_batches", LIVE_COLUMNS, rows)
            notes = (ANNOUNCE_BATCHES, (self.channel, self.replica, ids, runs, urgent))
        with cur.connection.pipeline():  # the rest: a round trip where a result is read
            super()._flush(cur)
            if pending:
                cur.execute(*notes)

    def _write_set_rollups(self, cur: Any, groups: list[ColumnGroup]) -> None:
        # Hold the sets' rows until the commit, before reading them (other replicas write).
        cur.execute(_LOCK_SETS, (sorted({group.set_id for group in groups}),))
        super()._write_set_rollups(cur, groups)

    def alive(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken

    def scalar_in(self, value: Any) -> Any:
        return NONFINITE_STRINGS[value] if isinstance(value, str) else value


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
