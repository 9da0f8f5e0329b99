"""The tables of a gradwatch database, the version of their layout, and the
connections every read and write goes through (:class:`Database`).

Step records live in chunks (store/chunks.py), their rollups one row per set of
series (store/rollups.py); runs, ranks, batches (deduplication), epochs, alerts,
the keys of each run and archived runs beside them. ``meta`` holds
``schema_version``: a database of another layout is refused when it is opened, with
what to do (:class:`SchemaMismatch`), never read half right. There is no migration:
the trainers' spools hold what they sent, and ``gradwatch upload`` sends it again.

Example:
    >>> [s.split(" (")[0] for s in statements("", "INTEGER", "BLOB", "INTEGER PRIMARY KEY",
    ...                                          "")][:3]
    ['CREATE TABLE meta', 'CREATE TABLE runs', 'CREATE TABLE ranks']
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

# The layout this code reads and writes; any change to a table is a new number.
SCHEMA_VERSION = 4
# What an insert does with a row already there (both dialects).
IGNORE = " ON CONFLICT DO NOTHING"


class SchemaMismatch(RuntimeError):
    """The database holds another layout than this gradwatch's (one line says what to do)."""

    def __init__(self, where: str, found: str) -> None:
        super().__init__(
            f"{where}: the database has storage layout {found}, this gradwatch reads layout"
            f" {SCHEMA_VERSION}; move it aside (or use another --db) and rebuild it with"
            " `gradwatch upload` of the trainers' spool"
        )


def statements(number: str, integer: str, blob: str, serial: str, clustered: str) -> list[str]:
    """CREATE statements for one dialect's column types (a new, empty database)."""
    head = f"run_id TEXT NOT NULL, rank {integer} NOT NULL"
    span = f"step_lo {integer} NOT NULL, step_hi {integer} NOT NULL, uid {integer} NOT NULL"
    return [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL,"
        f" world_size {integer} NOT NULL, started {number}, updated {number},"
        f" last_step {integer}, last_epoch {integer}, alerts {integer} NOT NULL DEFAULT 0,"
        " host TEXT, recurrent TEXT, modules TEXT)",
        f"CREATE TABLE ranks ({head}, hello TEXT NOT NULL, connected_at {number},"
        f" end_status TEXT, end_step {integer}, end_t {number}, PRIMARY KEY (run_id, rank))",
        f"CREATE TABLE batches ({head}, session TEXT NOT NULL, seq {integer} NOT NULL,"
        f" stored_at {number}, PRIMARY KEY (run_id, rank, session, seq))",
        # An integer id per (run, rank, name) of every scalar series: its rollups' key.
        f"CREATE TABLE series (id {serial}, {head}, name TEXT NOT NULL,"
        " UNIQUE (run_id, rank, name))",
        f"CREATE TABLE epochs ({head}, epoch {integer}, step {integer}, t {number},"
        f" duration_s {number}, steps {integer}, data TEXT)",
        "CREATE INDEX epochs_run_rank ON epochs (run_id, rank, epoch)",
        f"CREATE TABLE alerts (id {serial}, {head}, step {integer}, code TEXT,"
        " severity TEXT, state TEXT, subject TEXT, data TEXT)",
        "CREATE INDEX alerts_run ON alerts (run_id, id)",
        "CREATE TABLE run_keys (run_id TEXT NOT NULL, family TEXT NOT NULL,"
        " key TEXT NOT NULL, sub TEXT NOT NULL, PRIMARY KEY (run_id, family, key, sub))",
        # Archived runs: hidden from the runs list, their data kept (store/reads.py).
        f"CREATE TABLE run_archive (run_id TEXT PRIMARY KEY, archived_at {number})",
        # The chunks of step records (store/chunks.py; the columns in order: TABLES).
        f"CREATE TABLE step_chunks ({head}, {span}, n {integer} NOT NULL,"
        f" fields TEXT NOT NULL, steps {blob} NOT NULL, data {blob} NOT NULL, notes TEXT,"
        f" PRIMARY KEY (run_id, rank, step_lo, uid)){clustered}",
        f"CREATE TABLE named_chunks ({head}, {span}, written {integer} NOT NULL,"
        f" names {integer} NOT NULL, n {integer} NOT NULL, steps {blob} NOT NULL,"
        f" data {blob} NOT NULL, PRIMARY KEY (run_id, rank, step_lo, uid)){clustered}",
        f"CREATE TABLE series_chunks ({head}, family TEXT NOT NULL, module TEXT NOT NULL,"
        f" series TEXT NOT NULL, {span}, n {integer} NOT NULL, len {integer} NOT NULL,"
        f" steps {blob} NOT NULL, data {blob} NOT NULL)",
        "CREATE INDEX series_chunks_lookup"
        " ON series_chunks (run_id, family, module, series, rank, step_lo)",
        # Sets of series: their rollups (store/rollups.py) and a named chunk's names. A set
        # is found by a digest of its series ids: ~1,000 ids exceed PostgreSQL's limit
        # on an index entry (~2.7 KB).
        f"CREATE TABLE rollup_sets (id {serial}, digest TEXT NOT NULL UNIQUE,"
        " series TEXT NOT NULL)",
        f"CREATE TABLE rollup_members (series {integer} NOT NULL, set_id {integer} NOT NULL,"
        f" position {integer} NOT NULL, kind TEXT NOT NULL,"
        f" PRIMARY KEY (series, set_id)){clustered}",
        f"CREATE TABLE set_rollups (set_id {integer} NOT NULL, level {integer} NOT NULL,"
        f" block {integer} NOT NULL, n {integer} NOT NULL, step_lo {integer} NOT NULL,"
        f" step_hi {integer} NOT NULL, data {blob} NOT NULL,"
        f" PRIMARY KEY (set_id, level, block)){clustered}",
        "INSERT INTO meta (key, value) VALUES ('schema_version',"  # noqa: S608 (an int)
        f" '{SCHEMA_VERSION}')",
    ]


def create_or_check(cur: Any, where: str, tables: set[str], types: Sequence[str]) -> None:
    """Create the tables (``types``: :func:`statements`' column types) in a database
    without gradwatch's (``tables``: the names it already has), or check the version of
    one that has them; SchemaMismatch when it is another."""
    found = _version(cur, tables)
    if found is None:
        for statement in statements(*types):
            cur.execute(statement)
    elif found != str(SCHEMA_VERSION):
        raise SchemaMismatch(where, found)


def _version(cur: Any, tables: set[str]) -> str | None:
    """The layout version of a database holding ``tables``; None: no gradwatch tables."""
    if "meta" not in tables:
        return None
    cur.execute("SELECT value FROM meta WHERE key = 'schema_version'")
    row = cur.fetchone()
    return str(row[0]) if row is not None else "unknown"


def layout_problem(db: str) -> str | None:
    """The one line :class:`SchemaMismatch` says for the SQLite file ``db``, or None
    (no file yet, or this layout): checked before ``gradwatch serve`` says it serves,
    without opening a store (which would start its writer)."""
    if db == ":memory:" or not os.path.isfile(db) or os.path.getsize(db) == 0:
        return None
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        cur = conn.cursor()
        try:
            names = {r[0] for r in cur.execute("SELECT name FROM sqlite_master")}
            found = _version(cur, names)
        except sqlite3.DatabaseError as error:
            return f"{db}: not a gradwatch database ({error})"
    if found is None or found == str(SCHEMA_VERSION):
        return None
    return str(SchemaMismatch(db, found))


class Database(ABC):
    """What reads and writes (the mixins of store/base.py's Store) share: SQL in one
    dialect and one read connection per thread; a backend supplies the rest."""

    # "sqlite" or "postgresql" (how non-finite values order).
    kind: ClassVar[str]
    # The column types of statements(): number, integer, blob, serial, clustered.
    types: ClassVar[tuple[str, str, str, str, str]]
    # SQL written with "?" placeholders; PostgreSQL swaps them for "%s".
    placeholder: ClassVar[str] = "?"
    _local: threading.local
    _readers: list[Any]
    _readers_lock: threading.Lock

    @abstractmethod
    def connect(self) -> Any:
        """A new DB-API connection (autocommit off)."""

    def scalar_in(self, value: Any) -> Any:
        """A protocol number as this backend stores it in a numeric column (SQLite keeps
        the strings "NaN", "Infinity" and "-Infinity" as they are)."""
        return value

    def alive(self, conn: Any) -> bool:
        """Whether ``conn`` can still be used (a PostgreSQL server may drop it)."""
        return True

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def insert(self, table: str, columns: Sequence[str], then: str = "") -> str:
        """An INSERT of one row, ``then`` on a conflict."""
        marks = ", ".join("?" for _ in columns)
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){then}"  # noqa: S608

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """A condition that ``column`` is one of ``values``, and its parameters."""
        return f"{column} IN ({', '.join('?' for _ in values)})", list(values)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        """This thread's read connection, for one transaction of the caller's. On an
        error a broken connection is dropped (this thread reconnects on its next use;
        a PostgreSQL server may drop it) and a live one rolled back, then it raises."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connect()
            with self._readers_lock:
                self._readers.append(conn)
        try:
            yield conn
        except Exception:
            if not self.alive(conn):
                self._local.conn = None
            else:
                conn.rollback()
            raise

    def query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.reading() as conn:
            cur = conn.cursor()
            cur.execute(self.sql(text), tuple(params))
            result = list(cur.fetchall())
            # End the read transaction so the next query sees new commits.
            conn.rollback()
        return result

    def _own(self, *statements: tuple[str, tuple[Any, ...]]) -> int:
        """Run ``statements`` in one transaction of their own on this thread's connection,
        not queued behind the writer's batches; the last one's row count."""
        with self.reading() as conn:
            cur = conn.cursor()
            for text, params in statements:
                cur.execute(self.sql(text), params)
            count = int(cur.rowcount)
            conn.commit()
        return count
