"""PostgreSQL storage (psycopg 3): the same tables and SQL as SQLite.

One writer connection on the store's writer thread, one read connection per reading
thread; no pool is needed for that. Numbers live in ``double precision``, which holds
NaN and the infinities natively; they leave as the protocol's strings. Use a fresh
database or schema per deployment: ``postgresql://user@host/db?options=-csearch_path%3Dgw``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from gradwatch.protocol.messages import NONFINITE_STRINGS

from ..settings import Settings
from . import rollups, rows
from .base import Store


class PostgresStore(Store):
    """Chosen by ``--db postgresql://...``; several servers may share one database."""

    kind: ClassVar[str] = "postgresql"
    placeholder: ClassVar[str] = "%s"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)

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
        conn.commit()

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
