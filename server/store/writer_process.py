"""SQLite's writer in a process of its own, beside the server's event loop.

One Python process holds one GIL: at ~45,000 records/s the server's event loop
(websocket frames, validation, acks) and the store's writer (rows, rollups, SQLite)
took turns on one core while the other core idled. With the writer in a child
process each has a core (BENCHMARKS.md, "Ingest in columns"). The server process
validates, hands each message to the child over a pipe (store/handoff.py: a batch's
blocks as their raw bytes) and gets each one's verdict back; the child runs the same
:class:`~gradwatch.server.store.sqlite.SQLiteStore` writer (group commit, checkpoints)
and answers only after the commit, so an ``ack`` still means "durable". Reads stay in
the server process (SQLite WAL: readers never wait for the writer).

If the child dies, the writes it held fail (not acknowledged: their trainers resend)
and a new child starts for the next ones. The child ends when its pipe closes, so a
``kill -9`` of the server leaves no writer behind.

Example (what ``gradwatch serve --db runs.db`` does):
    >>> store = open_store(Settings(db="runs.db"))    # doctest: +SKIP
    >>> store.submit_batch(batch, session).result()   # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading

try:
    import fcntl
except ImportError:  # not on Windows: the pipe keeps its default size
    fcntl = None  # type: ignore[assignment]
from concurrent.futures import Future
from typing import Any

from ..settings import Settings
from .base import StoreDataError, StoreError
from .handoff import encode_batch, read_frame, write_frame


class WriterGone(StoreError):
    """The writer process ended before it answered (the write was not acknowledged)."""


class ProcessWriter:
    """The server process's end: ``submit`` returns a Future resolved by the child."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # id -> [future, the child its frame was written to (None: not yet)]
        self._pending: dict[int, list[Any]] = {}
        self._next = 0
        self._closing = False
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        # Frames wait here for the sending thread: a 300 KB batch fills the pipe
        # several times over, and the event loop that submits must not wait for that.
        self._outbox: queue.SimpleQueue[tuple[int, dict[str, Any], list[bytes]] | None]
        self._outbox = queue.SimpleQueue()
        self._start()
        self._sender = threading.Thread(
            target=self._send_frames, name="gradwatch-writer-send", daemon=True
        )
        self._sender.start()

    def _start(self) -> None:
        child = subprocess.Popen(
            [sys.executable, "-m", "gradwatch.server.store.writer_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "GRADWATCH_WRITER_SETTINGS": _settings_text(self.settings)},
        )
        # A 300 KB batch fills the default 64 KB pipe ~5 times, each a wait for the
        # child to read; a 1 MiB pipe takes a whole frame at once (Linux only).
        if fcntl is not None and child.stdin is not None:
            with contextlib.suppress(AttributeError, OSError):  # F_SETPIPE_SZ is Linux's
                fcntl.fcntl(child.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        self._child = child
        self._reader = threading.Thread(
            target=self._read_answers, args=(child,), name="gradwatch-writer-answers", daemon=True
        )
        self._reader.start()

    def submit(self, op: str, payload: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if op == "hello":
            head: dict[str, Any] = {"op": "hello", "hello": payload.model_dump_json()}
            parts: list[bytes] = []
        else:
            batch, session = payload
            head, parts = encode_batch(batch, session)
        with self._lock:
            if self._closing:
                future.set_exception(WriterGone("the store is closed"))
                return future
            ident = head["id"] = self._next
            self._next += 1
            self._pending[ident] = [future, None]
        self._outbox.put((ident, head, parts))
        return future

    def _send_frames(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            ident, head, parts = item
            with self._lock:
                child = self._child
                entry = self._pending.get(ident)
                if entry is not None:
                    entry[1] = child  # if this child dies unanswered, its reader fails it
            try:
                if child is None or child.stdin is None or child.poll() is not None:
                    raise WriterGone("the writer process is not running")
                write_frame(child.stdin, head, parts)
                if self._outbox.empty():
                    child.stdin.flush()
            except (OSError, ValueError, WriterGone) as error:
                with self._lock:
                    entry = self._pending.pop(ident, None)
                    self._restart_locked(child)
                if entry is not None:
                    entry[0].set_exception(WriterGone(f"the writer process is gone ({error})"))

    def _read_answers(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        while True:
            frame = read_frame(child.stdout)
            if frame is None:
                break
            head, _ = frame
            with self._lock:
                entry = self._pending.pop(head["id"], None)
            if entry is None:
                continue
            future = entry[0]
            if "error" in head:
                kind = StoreDataError if head.get("data_error") else StoreError
                future.set_exception(kind(head["error"]))
            else:
                future.set_result(head.get("result"))
        child.stdout.close()
        child.wait()
        with self._lock:
            # What was written to this child and never answered is lost with it; what
            # the sending thread has not written yet goes to the next child.
            lost = [i for i, (_, to) in self._pending.items() if to is child]
            futures = [self._pending.pop(i)[0] for i in lost]
            self._restart_locked(child)
        for future in futures:
            future.set_exception(WriterGone(f"the writer process exited ({child.returncode})"))

    def _restart_locked(self, child: subprocess.Popen[bytes] | None) -> None:
        if self._closing or self._child is not child:
            return
        if child is not None and child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()
        with contextlib.suppress(OSError):
            self._start()

    def close(self, timeout: float = 30.0) -> None:
        """Let the child finish what it holds, then wait for it to end. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._outbox.put(None)
        self._sender.join(timeout=timeout)  # every frame submitted is in the pipe
        with self._lock:
            child, reader = self._child, self._reader
        if child is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if child.stdin is not None:
                child.stdin.close()  # the child finishes its queue, then ends
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if reader is not None:
            reader.join(timeout=timeout)  # every answer read, the pipe closed


def _settings_text(settings: Settings) -> str:
    import json

    # What the writer needs, and nothing secret.
    return json.dumps(
        {
            "db": settings.db,
            "sqlite_synchronous": settings.sqlite_synchronous,
            "group_commit": settings.group_commit,
        }
    )
