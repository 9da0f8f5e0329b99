"""SQLite's writer in a process of its own (why, and what it promises: docs/DEPLOY.md,
"What runs, and where the records go"), and the frames the two processes speak.

The child (``python -m gradwatch.server.store.sqlite``) answers each frame after its
commit; if it dies, what it held fails (not acknowledged: resent) and a new child
starts; it ends when its pipe closes, so a ``kill -9`` of the server leaves no writer.

A frame is ``<u32 head length><u32 body length><head JSON><body bytes>``: a batch's
column blocks as their raw bytes (checked already) under a small JSON head naming
them, its other records as their validated JSON, so nothing is parsed twice (and
nothing unpickled). PostgreSQL keeps a batch's frame for other replicas.

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> batch = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 3,'
    ...                       ' "records": [{"kind": "epoch", "epoch": 1}]}')
    >>> again = batch_of(frame_bytes(batch, "s1"))
    >>> again.seq, again.records[0].epoch
    (3, 1)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from itertools import accumulate
from typing import IO, Any

from ..schema import RECORDS, Batch, StepColumns
from ..settings import Settings
from .base import StoreDataError, StoreError

_SIZES = struct.Struct("<II")


def write_frame(out: IO[bytes], head: dict[str, Any], body: Sequence[bytes] = ()) -> None:
    """One frame: the head as JSON, then the body's parts (written as they are, not
    joined: a batch's body is ~300 KB)."""
    text = json.dumps(head, separators=(",", ":")).encode()
    out.write(_SIZES.pack(len(text), sum(map(len, body))) + text)
    for part in body:
        out.write(part)


def frame_bytes(batch: Batch, session: str) -> bytes:
    """A batch's frame as one bytes object (kept by PostgreSQL for other replicas)."""
    head, parts = encode_batch(batch, session)
    head["id"] = 0
    out = io.BytesIO()
    write_frame(out, head, parts)
    return out.getvalue()


def batch_of(data: bytes) -> Batch:
    """The batch of :func:`frame_bytes`."""
    frame = read_frame(io.BytesIO(data))
    if frame is None:
        raise ValueError(f"expected a whole frame, got {len(data)} bytes")
    return decode_batch(*frame)[1]


def read_frame(source: IO[bytes]) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, or None at the end of the stream (``source`` is buffered: a
    read returns every byte asked for unless the stream ends)."""
    sizes = source.read(_SIZES.size)
    if len(sizes) < _SIZES.size:
        return None
    head_size, body_size = _SIZES.unpack(sizes)
    head, body = source.read(head_size), source.read(body_size)
    if len(head) < head_size or len(body) < body_size:
        return None
    return json.loads(head), body


def encode_batch(batch: Batch, session: str) -> tuple[dict[str, Any], list[bytes]]:
    """A validated batch as a frame's head (``id`` still to be set) and body parts: the
    records as JSON, each column block as its dump with None for each bytes value (a
    dump without None values has no other), those bytes in the body in dump order."""
    parts = [RECORDS.dump_json(batch.records, exclude_unset=True) if batch.records else b""]

    def lift(value: Any) -> Any:
        if isinstance(value, bytes):
            parts.append(value)
            return None
        return {k: lift(v) for k, v in value.items()} if isinstance(value, dict) else value

    blocks = [lift(b.model_dump(exclude_none=True, by_alias=True)) for b in batch.columns]
    head = {
        "op": "batch",
        "session": session,
        "run_id": batch.run_id,
        "rank": batch.rank,
        "seq": batch.seq,
        "blocks": blocks,
        "sizes": [len(part) for part in parts],
        "extra": batch.__pydantic_extra__ or {},
    }
    return head, parts


def decode_batch(head: dict[str, Any], body: bytes) -> tuple[int, Batch, str]:
    """(id, batch, session) of a batch frame made by :func:`encode_batch`; the blocks
    are validated again as Python values (cheap: their bytes are not decoded)."""
    ends = list(accumulate(head["sizes"]))
    records, *rest = (body[end - size : end] for size, end in zip(head["sizes"], ends, strict=True))
    parts = iter(rest)

    def fill(value: Any) -> Any:
        if value is None:
            return next(parts)
        return {k: fill(v) for k, v in value.items()} if isinstance(value, dict) else value

    batch = Batch.model_construct(
        type="batch",
        run_id=head["run_id"],
        rank=head["rank"],
        seq=head["seq"],
        records=RECORDS.validate_json(records) if records else [],
        columns=[StepColumns.model_validate(fill(block)) for block in head["blocks"]],
        **head["extra"],
    )
    return head["id"], batch, head["session"]


class WriterGone(StoreError):
    """The writer process ended before it answered (the write was not acknowledged)."""


class ProcessWriter:
    """The server process's end: the store's writer thread ``send``s each group's
    frames; a thread reading the child's answers resolves their futures."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # id -> (future, the child its frame was written to)
        self._pending: dict[int, tuple[Future[Any], Any]] = {}
        self._next = 0
        self._closing = False
        with self._lock:  # before its reader may restart it
            self._child, self._reader = self._start()

    def _start(self) -> tuple[subprocess.Popen[bytes], threading.Thread]:
        # What the child needs of the settings, and nothing secret.
        keys = ("db", "sqlite_synchronous", "group_commit")
        settings = {key: getattr(self.settings, key) for key in keys}
        child = subprocess.Popen(
            [sys.executable, "-m", "gradwatch.server.store.sqlite"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "GRADWATCH_WRITER_SETTINGS": json.dumps(settings)},
        )
        # A 300 KB batch fills the default 64 KB pipe ~5 times, each a wait for the
        # child to read; a 1 MiB pipe takes a whole frame at once (F_SETPIPE_SZ: Linux).
        with contextlib.suppress(ImportError, AttributeError, OSError):
            import fcntl

            if child.stdin is not None:
                fcntl.fcntl(child.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        reader = threading.Thread(
            target=self._read_answers, args=(child,), name="gradwatch-writer-answers", daemon=True
        )
        reader.start()
        return child, reader

    def send(self, group: list[tuple[str, Any, Future[Any]]]) -> None:
        """Write the frames of ``(op, payload, future)`` items to the child, in order."""
        frames = [
            ({"op": "hello", "hello": payload.model_dump_json()}, [])
            if op == "hello"
            else encode_batch(*payload)
            for op, payload, _ in group
        ]
        with self._lock:
            child, first = self._child, self._next
            self._next += len(group)
            for ident, (_, _, future) in enumerate(group, first):
                self._pending[ident] = (future, child)
        try:
            if child.stdin is None or child.poll() is not None:
                raise WriterGone("the writer process is not running")
            for ident, (head, parts) in enumerate(frames, first):
                head["id"] = ident
                write_frame(child.stdin, head, parts)
            child.stdin.flush()
        except Exception as error:  # a broken pipe, most likely: this child is done
            with self._lock:
                lost = [self._pending.pop(i, None) for i in range(first, first + len(group))]
                self._restart_locked(child)
            for entry in lost:
                if entry is not None:
                    entry[0].set_exception(WriterGone(f"the writer process is gone ({error})"))

    def _read_answers(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        while (frame := read_frame(child.stdout)) is not None:
            head = frame[0]
            with self._lock:
                entry = self._pending.pop(head["id"], None)
            if entry is None:
                continue
            if "error" in head:
                kind = StoreDataError if head.get("data_error") else StoreError
                entry[0].set_exception(kind(head["error"]))
            else:
                entry[0].set_result(head.get("result"))
        child.stdout.close()
        child.wait()
        with self._lock:
            # What was written to this child and never answered is lost with it.
            lost = [i for i, (_, to) in self._pending.items() if to is child]
            futures = [self._pending.pop(i)[0] for i in lost]
            self._restart_locked(child)
        for future in futures:
            future.set_exception(WriterGone(f"the writer process exited ({child.returncode})"))

    def _restart_locked(self, child: subprocess.Popen[bytes]) -> None:
        if self._closing or self._child is not child:
            return
        if child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()
        with contextlib.suppress(OSError):
            self._child, self._reader = self._start()

    def close(self) -> None:
        """Let the child finish what it holds (every frame is sent: the store's writer
        thread has ended), then wait for it to end. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            child, reader = self._child, self._reader
        with contextlib.suppress(OSError, ValueError):
            if child.stdin is not None:
                child.stdin.close()  # the child finishes its queue, then ends
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        reader.join(timeout=30)  # every answer read, the pipe closed
