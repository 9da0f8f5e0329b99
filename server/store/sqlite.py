"""SQLite storage: WAL, one writer thread, one read connection per thread.

``synchronous=NORMAL`` in WAL mode: a committed transaction survives a crash or
``kill -9`` of the server; only a power loss may drop the last few
(``Settings.sqlite_synchronous="FULL"`` fsyncs every commit instead).

Checkpoints run on a thread of their own every :data:`CHECKPOINT_EVERY_S`, not inside
the writer's commits as SQLite's automatic checkpoint would: commits took half as long
without them (BENCHMARKS.md, "Ingest"). New databases use 16 KiB pages, which hold a
few 2 KB timestep blobs each (4 KiB pages: ~1.6x the write time).

Run as ``python -m gradwatch.server.store.sqlite``, this module is the writer process
(store/writer_process.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, Any, ClassVar

from ..schema import Hello
from ..settings import Settings
from . import tables
from .base import Store, StoreDataError
from .writer_process import ProcessWriter, decode_batch, read_frame, write_frame

# Often enough that the WAL stays a few MB at ~10 MB/s of ingest.
CHECKPOINT_EVERY_S = 0.5


class SQLiteStore(Store):
    """The default store: one file, no server to run."""

    kind: ClassVar[str] = "sqlite"
    # Numeric columns without a declared type keep "NaN"/"Infinity" strings as text
    # (a REAL column would turn NaN into NULL).
    types = ("", "INTEGER", "BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT", " WITHOUT ROWID")

    def __init__(self, settings: Settings) -> None:
        self.path = Path(settings.db)
        self._stop_checkpoints = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(settings)
        if str(self.path) != ":memory:" and self._remote is None:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="gradwatch-sqlite-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def connect(self) -> Any:
        # timeout: SQLite's busy timeout, how long a connection waits for a lock.
        conn = sqlite3.connect(
            self.path, timeout=30, check_same_thread=False, isolation_level="DEFERRED"
        )
        # Only a new, empty database takes it (before WAL mode fixes the page size).
        conn.execute("PRAGMA page_size=16384")
        conn.execute("PRAGMA journal_mode=WAL")
        # No connection checkpoints on commit; _checkpoint_loop does.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(f"PRAGMA synchronous={self.settings.sqlite_synchronous.upper()}")
        return conn

    def create_schema(self, conn: Any) -> None:
        # BEGIN IMMEDIATE: two processes opening one new file create its tables once;
        # the connection's context commits, or rolls back on any error.
        with conn:
            cur = conn.execute("BEGIN IMMEDIATE")
            found = {
                r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            tables.create_or_check(cur, str(self.path), found, self.types)

    def remote_writer(self) -> Any:
        if not self.settings.writer_process or str(self.path) == ":memory:":
            return None
        return ProcessWriter(self.settings)

    def _checkpoint_loop(self) -> None:
        conn = self.connect()
        try:
            while not self._stop_checkpoints.wait(CHECKPOINT_EVERY_S):
                # PASSIVE: copies what no reader still needs, never waits for anyone.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            conn.close()

    def close(self) -> None:
        """Finish queued writes, checkpoint the WAL, close every connection. Idempotent."""
        super().close()
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=30)
            self._checkpointer = None
            with contextlib.suppress(sqlite3.Error), contextlib.closing(self.connect()) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def main() -> None:
    """The writer process: frames in on stdin, verdicts out on stdout, in the order of
    commits; the settings come in an environment variable."""
    values = json.loads(os.environ["GRADWATCH_WRITER_SETTINGS"])
    source: IO[bytes] = sys.stdin.buffer
    # The frames own stdout; anything printed by accident goes to stderr instead.
    out: IO[bytes] = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    out_lock = threading.Lock()
    store = SQLiteStore(replace(Settings(**values), writer_process=False))

    def answer(ident: int, future: Future[Any]) -> None:
        error = future.exception()
        head: dict[str, Any] = {"id": ident}
        if error is None:
            head["result"] = future.result()
        else:
            head["error"] = str(error)
            head["data_error"] = isinstance(error, StoreDataError)
        with out_lock, contextlib.suppress(OSError, ValueError):
            write_frame(out, head)
            # The writer thread's answers leave together after its group (flush_answers).
            if threading.current_thread() is not store.writer_thread:
                out.flush()

    def flush_answers() -> None:
        with out_lock, contextlib.suppress(OSError, ValueError):
            out.flush()

    store.after_group = flush_answers
    try:
        while (frame := read_frame(source)) is not None:
            head, body = frame
            future: Future[Any]
            if head["op"] == "hello":
                ident = int(head["id"])
                future = store.submit_hello(Hello.model_validate_json(head["hello"]))
            else:
                ident, batch, session = decode_batch(head, body)
                future = store.submit_batch(batch, session)
            future.add_done_callback(partial(answer, ident))
    finally:
        store.close()  # finishes every queued write (each answered), checkpoints


if __name__ == "__main__":
    main()
