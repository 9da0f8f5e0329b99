"""PostgreSQL storage (psycopg 3): the same tables and SQL as SQLite.

One writer connection on the store's writer thread, one read connection per reading
thread; no pool is needed for that. Numbers live in ``double precision``, which holds
NaN and the infinities natively; they leave as the protocol's strings. Use a fresh
database or schema per deployment: ``postgresql://user@host/db?options=-csearch_path%3Dgw``.

Several replicas may share one database: each batch's transaction also stores its
records for live viewers and NOTIFYs the other replicas (:mod:`.pgfeed`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import psycopg

from gradwatch.protocol.messages import ALERT, END, NONFINITE_STRINGS

from ..columns import records_json
from ..settings import Settings
from . import pgfeed, rollups, rows
from .base import Store

# aggregate_columns gives one row per (series, level, block): one statement may
# upsert them all (a key twice would be refused).
_ROLLUPS_UNNEST = rollups.UPSERT.replace(
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[],"
    " %s::float8[], %s::bigint[], %s::float8[], %s::bigint[])",
)


_TIMESTEPS_COPY = (
    "COPY timesteps (run_id, rank, step, module, series, n, data) FROM STDIN (FORMAT BINARY)"
)
_TIMESTEP_TYPES = ["text", "int8", "int8", "text", "text", "int8", "bytea"]


class PostgresStore(Store):
    """Chosen by ``--db postgresql://...``; several servers may share one database."""

    kind: ClassVar[str] = "postgresql"
    placeholder: ClassVar[str] = "%s"

    def __init__(self, settings: Settings) -> None:
        # Set before the writer thread starts (in Store.__init__); the channel is set
        # by create_schema, which knows the connection's schema.
        self.replica = uuid.uuid4().hex[:16]
        self.channel = pgfeed.channel_for("public")
        self._pruned = 0.0
        super().__init__(settings)

    def listener(self, deliver: Callable[[pgfeed.Delivery], None]) -> pgfeed.Listener:
        """A (not yet started) thread that hands ``deliver`` what other replicas stored."""
        return pgfeed.Listener(self.settings.db, self.channel, self.replica, deliver)

    def live_rows(self, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """``(id, run_id, rank, seq, records)`` of stored live batches, by row id."""
        return self.query(
            "SELECT id, run_id, rank, seq, records FROM live_batches WHERE id = ANY(?)",
            (list(ids),),
        )

    def live_rows_since(self, seconds: float) -> list[tuple[Any, ...]]:
        """``(id, run_id, rank, seq, records, urgent)`` other replicas stored in the last
        ``seconds``, in the order they were stored (a LISTEN connection came back)."""
        return self.query(
            "SELECT id, run_id, rank, seq, records, urgent FROM live_batches"
            " WHERE created >= clock_timestamp() - make_interval(secs => ?) AND replica <> ?"
            " ORDER BY id",
            (seconds, self.replica),
        )

    def connect(self) -> Any:
        return psycopg.connect(self.settings.db, autocommit=False)

    def create_schema(self, conn: Any) -> None:
        with conn.cursor() as cur:
            # Serialise schema creation between servers starting at once.
            cur.execute("SELECT pg_advisory_xact_lock(4242424242)")
            for statement in rows.schema(
                number="DOUBLE PRECISION",
                integer="BIGINT",
                blob="BYTEA",
                serial="BIGSERIAL PRIMARY KEY",
            ):
                cur.execute(statement)
            cur.execute(pgfeed.LIVE_TABLE)
            cur.execute(pgfeed.LIVE_STORAGE)
            cur.execute(pgfeed.LIVE_INDEX)
            cur.execute("SELECT current_schema()")
            self.channel = pgfeed.channel_for(str(cur.fetchone()[0]))
        conn.commit()

    # The writer thread runs these inside the transaction of the hello or batch, so the
    # notification leaves at its COMMIT, after the rows are readable by every replica.
    def _write_hello(self, cur: Any, hello: Any) -> None:
        super()._write_hello(cur, hello)
        cur.execute(pgfeed.ANNOUNCE_HELLO, (self.channel, self.replica, hello.run_id))

    def _write_batch(self, cur: Any, batch: Any, session: str) -> bool:
        if not super()._write_batch(cur, batch, session):
            return False
        records = records_json(batch)
        # As ingest decides for its own viewers: the runs list updates at once.
        urgent = any(r.kind in (END, ALERT) for r in batch.records)
        cur.execute(
            pgfeed.ANNOUNCE_BATCH,
            (self.replica, batch.run_id, batch.rank, batch.seq, urgent, records,
             self.channel, self.replica, batch.run_id, urgent),
        )
        now = time.monotonic()
        if now - self._pruned > pgfeed.PRUNE_EVERY_S:
            self._pruned = now
            cur.execute(pgfeed.PRUNE, (pgfeed.RETAIN_S,))
        return True

    # The ~180 rollup rows of a batch as one statement of arrays: 43 instead of 74 us
    # per record with executemany (BENCHMARKS.md, "Ingest: packed named scalars").
    def _upsert_rollups(self, cur: Any, found: list[tuple[Any, ...]]) -> None:
        columns: list[list[Any]] = [list(column) for column in zip(*found, strict=True)]
        for at in (4, 6):  # min_v, max_v: a count (an int) among floats
            columns[at] = [float(v) for v in columns[at]]
        cur.execute(_ROLLUPS_UNNEST, columns)

    # Binary COPY: ~2.3x faster than executemany for 200 rows of 1 KB blobs (98 -> 42
    # us per record, BENCHMARKS.md "Ingest"). `timesteps` has no unique key to conflict
    # on, so COPY's lack of ON CONFLICT changes nothing.
    def _insert_timesteps(self, cur: Any, found: list[tuple[Any, ...]]) -> None:
        with cur.copy(_TIMESTEPS_COPY) as copy:
            copy.set_types(_TIMESTEP_TYPES)
            for row in found:
                copy.write_row(row)

    def alive(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken

    def scalar_in(self, value: Any) -> Any:
        if isinstance(value, str):
            return NONFINITE_STRINGS[value]
        return value

    value_key = staticmethod(rollups.postgres_key)

    def bucket_extremes(
        self,
        table: str,
        where: str,
        params: Sequence[Any],
        expr: str,
        bounds: Sequence[tuple[int, int]],
    ) -> list[tuple[int, Any]]:
        # One statement per extreme: a LATERAL top-1 over each bucket's key range, so
        # PostgreSQL never sorts the whole range (DISTINCT ON over 1e6 rows: 6.8 s vs 1.7 s).
        # Non-finite floats order above every number (NaN highest), as in SQLite.
        starts = [b[0] for b in bounds]
        ends = [b[1] for b in bounds]
        found: list[tuple[int, Any]] = []
        for order in ("ASC", "DESC"):
            found.extend(
                self.query(
                    "SELECT m.step, m.v FROM"  # noqa: S608
                    " unnest(?::bigint[], ?::bigint[]) AS b(lo, hi) CROSS JOIN LATERAL"
                    f" (SELECT step, {expr} AS v FROM {table} WHERE {where}"
                    f" AND step >= b.lo AND step <= b.hi AND {expr} IS NOT NULL"
                    f" ORDER BY {expr} {order}, step LIMIT 1) AS m",
                    (starts, ends, *params),
                )
            )
        return found
