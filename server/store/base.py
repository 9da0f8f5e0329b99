"""The storage interface, and the SQL both backends share.

A store has one writer thread that owns the write connection. Ingest submits work
(``submit_hello``, ``submit_batch``) and gets a ``concurrent.futures.Future``; the
writer takes whatever is waiting, up to ``Settings.group_commit`` items, writes it in
ONE transaction ("group commit") and only then resolves the futures, so an ``ack``
sent on one means "durable". Reads are plain methods, safe from any thread (one read
connection per thread). A batch whose ``(run_id, rank, session, seq)`` is already in
``batches`` is acknowledged and nothing else is written (its future says False).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from gradwatch.protocol.codec import dumps

from ..settings import Settings
from .chunk_writes import ChunkWrites
from .history import HistoryReads
from .split import ALERT_INSERT, END_UPDATE, EPOCH_INSERT, split_batch
from .tables import IGNORE

_STOP = object()


class StoreError(RuntimeError):
    """The database refused or lost a write; the batch was not acknowledged."""


class StoreDataError(StoreError):
    """The database refused the data itself: sending it again cannot help."""


def store_error(error: BaseException) -> StoreError:
    """``error`` as a StoreError, a StoreDataError when it is about the values.

    A data exception (SQLSTATE class 22: a NUL in text, a number out of range) or an
    OverflowError recurs on every resend; anything else (a lost connection, a locked
    or full disk) may pass, so the trainer resends.
    """
    text = f"{type(error).__name__}: {error}"
    sqlstate = str(getattr(error, "sqlstate", "") or "")
    # psycopg refuses a NUL in text before it reaches the server: a DataError, no SQLSTATE.
    named = any(kind.__name__ == "DataError" for kind in type(error).__mro__)
    if isinstance(error, OverflowError) or sqlstate.startswith("22") or named:
        return StoreDataError(text)
    return StoreError(text)


class Store(ChunkWrites, HistoryReads):
    """SQL storage shared by SQLite and PostgreSQL; subclasses supply connections."""

    # Called on the writer thread after each group's futures are resolved (the writer
    # process sends their answers in one write).
    after_group: Callable[[], None] | None = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._queue: queue.Queue[Any] = queue.Queue()
        self._local = threading.local()
        self._readers: list[Any] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._forget_ids()
        self._discard_pending()
        writer = self.connect()
        try:
            self.create_schema(writer)
        except BaseException:
            writer.close()
            raise
        self._writer_conn = writer
        # A writer elsewhere (SQLite's writer process) takes the writes: this thread
        # only sends them (store/writer_process.py).
        self._remote = self.remote_writer()
        if self._remote is not None:
            writer.close()
        # The thread that writes (and resolves the futures of) every submission.
        self.writer_thread = threading.Thread(
            target=self._write_loop, name="gradwatch-store-writer", daemon=True
        )
        self.writer_thread.start()

    # ----- what a backend provides (and connect, scalar_in: store/tables.py) -------
    @abstractmethod
    def create_schema(self, conn: Any) -> None:
        """Create the tables in a new database, or check its layout's version
        (store/tables.py: SchemaMismatch for another one)."""

    def remote_writer(self) -> Any:
        """An object whose ``send(group)`` writes each group instead of this thread
        (store/writer_process.py), or None."""
        return None

    # ----- writes ------------------------------------------------------------------
    def submit_hello(self, hello: Any) -> Future[None]:
        """Create the run (first hello of any rank) and record this rank's hello."""
        return self._submit("hello", hello)

    def submit_batch(self, batch: Any, session: str = "") -> Future[bool]:
        """Store a validated batch once per ``(run_id, rank, session, seq)``; the future
        says whether it was new. ``session`` is the hello's (one per trainer process)."""
        return self._submit("batch", (batch, session))

    def _submit(self, op: str, payload: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self._closed:
            future.set_exception(StoreError("the store is closed"))
            return future
        self._queue.put((op, payload, future))
        return future

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            group = [self._queue.get()]
            while group[-1] is not _STOP and len(group) < self.settings.group_commit:
                try:
                    group.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if stop := group[-1] is _STOP:
                group.pop()
            if not group:
                break
            try:
                if self._remote is not None:
                    self._remote.send(group)
                else:
                    self._write_group(self._writer_conn, group)
            except Exception as error:  # never let the writer die: fail what it held
                for _, _, future in group:
                    if not future.done():
                        future.set_exception(StoreError(f"{type(error).__name__}: {error}"))
            if self.after_group is not None:
                self.after_group()
            if self._remote is None and not self.alive(self._writer_conn):
                # The batches that failed were not acknowledged; their trainers resend.
                with contextlib.suppress(Exception):
                    self._writer_conn = self.connect()
        with contextlib.suppress(Exception):
            self._writer_conn.close()

    def _write_group(self, conn: Any, group: list[Any]) -> None:
        try:
            results = self._commit(conn, group)
        except Exception:
            # Retried one by one, each with its own verdict; on a lost connection each
            # fails (not acknowledged, so resent) and the loop reconnects.
            for item in group:
                try:
                    result = self._commit(conn, [item])[0]
                except Exception as error:
                    item[2].set_exception(store_error(error))
                    continue
                item[2].set_result(result)
            return
        for (_, _, future), result in zip(group, results, strict=True):
            future.set_result(result)

    def _commit(self, conn: Any, group: list[Any]) -> list[Any]:
        """Write ``group`` in one transaction; roll back (ids created in it are
        forgotten) and raise on any error."""
        try:
            self._discard_pending()
            self._begin(conn, group)
            cur = conn.cursor()
            results = [self._apply(cur, op, payload) for op, payload, _ in group]
            self._flush(cur)
            conn.commit()
        except Exception:
            with contextlib.suppress(Exception):  # a lost connection is reported by the caller
                conn.rollback()
            self._forget_ids()
            raise
        return results

    def _begin(self, conn: Any, group: list[Any]) -> None:
        """The transaction's first statements (PostgreSQL: its locks, the group's claims)."""

    def _claim(self, cur: Any, batch: Any, session: str) -> bool:
        """Add the batch to ``batches``; False if it is there already (a repeat)."""
        insert = self.insert("batches", ("run_id", "rank", "session", "seq", "stored_at"), IGNORE)
        cur.execute(self.sql(insert), (batch.run_id, batch.rank, session, batch.seq, time.time()))
        return bool(cur.rowcount)

    def _apply(self, cur: Any, op: str, payload: Any) -> Any:
        if op == "batch":
            return self._write_batch(cur, *payload)
        self._write_hello(cur, payload)
        return None

    def _write_hello(self, cur: Any, hello: Any) -> None:
        now, model = time.time(), hello.model
        shapes = (dumps(list(model.recurrent)), dumps({m.name: m.type for m in model.modules}))
        cur.execute(
            self.sql(
                "INSERT INTO runs (id, name, world_size, started, updated, host, recurrent,"
                " modules) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET updated = excluded.updated,"
                " world_size = CASE WHEN excluded.world_size > runs.world_size"
                " THEN excluded.world_size ELSE runs.world_size END"
            ),
            (hello.run_id, hello.run, hello.world_size, now, now, hello.host, *shapes),
        )
        cur.execute(
            self.sql(
                "INSERT INTO ranks (run_id, rank, hello, connected_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, rank) DO UPDATE SET hello = excluded.hello,"
                " connected_at = excluded.connected_at"
            ),
            (hello.run_id, hello.rank, hello.model_dump_json(), now),
        )

    def _write_batch(self, cur: Any, batch: Any, session: str) -> bool:
        run_id, rank = batch.run_id, batch.rank
        if not self._claim(cur, batch, session):
            return False  # a repeat: acknowledged, not stored again
        split = split_batch(batch, self.scalar_in, session)
        self._write_chunks(cur, run_id, rank, split)
        if split.epochs:
            cur.executemany(self.sql(EPOCH_INSERT), split.epochs)
        if split.alerts:
            cur.executemany(self.sql(ALERT_INSERT), split.alerts)
        # A run's keys rarely change: only those this writer has not written yet.
        new_keys = [k for k in ((run_id, *k) for k in split.keys) if k not in self._keys_written]
        if new_keys:
            columns = ("run_id", "family", "key", "sub")
            self._insert_rows(cur, "run_keys", columns, sorted(new_keys), IGNORE)
            if len(self._keys_written) > 1_000_000:
                self._keys_written.clear()
            self._keys_written.update(new_keys)
        if split.ends:
            cur.executemany(self.sql(END_UPDATE), split.ends)
        # The run's row is updated once per transaction (ChunkWrites._flush).
        step, epoch, problems = self._runs_pending.get(run_id, (-1, -1, 0))
        last = (max(step, split.last_step), max(epoch, split.last_epoch))
        self._runs_pending[run_id] = (*last, problems + split.problems)
        return True

    def close(self) -> None:
        """Finish queued writes, then close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self.writer_thread.join(timeout=30)
        if self._remote is not None:
            self._remote.close()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            with contextlib.suppress(Exception):  # best effort: a reader of another thread
                conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
