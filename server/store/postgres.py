"""PostgreSQL storage (psycopg 3): the same tables and SQL as SQLite.

One writer connection on the store's writer thread, one read connection per reading
thread; no pool is needed for that. Numbers live in ``double precision``, which holds
NaN and the infinities natively; they leave as the protocol's strings. Use a fresh
database or schema per deployment: ``postgresql://user@host/db?options=-csearch_path%3Dgw``.
"""

from __future__ import annotations

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

    def scalar_in(self, value: Any) -> Any:
        if isinstance(value, str):
            return NONFINITE_STRINGS[value]
        return value

    def json_field(self, column: str, *keys: str) -> str:
        path = ", ".join(f"'{k}'" for k in keys)
        return f"json_extract_path_text({column}::json, {path})"
