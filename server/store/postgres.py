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
from . import rows
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

    def bucket_extremes(
        self, table: str, where: str, params: Sequence[Any], expr: str, lo: int, width: int
    ) -> list[tuple[int, Any]]:
        found: list[tuple[int, Any]] = []
        for order in ("ASC", "DESC"):
            found.extend(
                (step, value)
                for _, step, value in self.query(
                    f"SELECT DISTINCT ON (b) (step - ?) / ? AS b, step, v FROM"  # noqa: S608
                    f" (SELECT step, {expr} AS v FROM {table} WHERE {where}) AS s"
                    f" WHERE v IS NOT NULL ORDER BY b, v {order}, step",
                    (lo, width, *params),
                )
            )
        return found
