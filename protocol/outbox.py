"""The sender's outbox: unacknowledged batches in a bounded memory window, then a spool.

Every batch gets the next ``seq`` of its ``(run_id, rank)`` and stays here until the
server acknowledges it. Batches live in one of two places, and the order is kept:

- ``memory``: the oldest batches, at most ``window_batches`` / ``window_bytes`` of
  them; these are the ones in flight on the websocket (pipelined, not stop-and-wait).
- ``disk``: newer batches appended to the spool file (JSON Lines, exactly the wire
  messages, ``hello`` first), used whenever the window is full or the server is away.
  They move into memory, oldest first, as the window frees up.

So every memory batch is older than every disk batch, and what goes out is always in
``seq`` order. A batch added while connected with an empty disk queue goes straight
into memory, and is merged with the newest memory batch while that one has not been
sent yet (batching under load without a fixed flush delay): its ``records`` and its
``columns`` (blocks of step records, docs/PROTOCOL.md) each join the tail's own.

The spool file is flushed to the OS per batch, so it survives a crash of the training
process. Once everything written to it is acknowledged, it is removed.

Not thread-safe by itself: :class:`~gradwatch.protocol.sender.WebSocketSink` calls it
under its lock.

Example:
    >>> import tempfile, os
    >>> box = Outbox(os.path.join(tempfile.mkdtemp(), "s.jsonl"),
    ...              {"type": "hello", "protocol": 1, "run_id": "r", "rank": 0})
    >>> box.add('{"kind":"step","step":0}', 1, direct=False)   # offline: to disk
    >>> b = box.next_to_send(); b.seq, b.from_disk
    (0, True)
    >>> b.text
    '{"type":"batch","run_id":"r","rank":0,"seq":0,"records":[{"kind":"step","step":0}]}'
    >>> box.ack(0), box.empty
    (True, True)
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .codec import dumps
from .leftovers import lock_spool
from .messages import MAX_MESSAGE_BYTES, MAX_RECORDS_PER_BATCH

# Room for the batch envelope ({"type":"batch","run_id":...,"seq":...}) within the limit.
ENVELOPE_BYTES = 1024


def encode_records(
    records: list[dict[str, Any]], max_bytes: int
) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
    """Records as JSON array insides of at most ``max_bytes`` / 10,000 records each.

    Returns (chunks as (text, count), records too big for any message).
    """
    whole = dumps(records)
    if len(whole) - 2 <= max_bytes and len(records) <= MAX_RECORDS_PER_BATCH:
        return [(whole[1:-1], len(records))], []
    hard = MAX_MESSAGE_BYTES - ENVELOPE_BYTES
    chunks: list[tuple[str, int]] = []
    too_big: list[dict[str, Any]] = []
    parts: list[str] = []
    size = 0
    for record in records:
        text = dumps(record)
        if len(text) > hard:
            too_big.append(record)
            continue
        if parts and (size + 1 + len(text) > max_bytes or len(parts) >= MAX_RECORDS_PER_BATCH):
            chunks.append((",".join(parts), len(parts)))
            parts, size = [], 0
        parts.append(text)
        size += len(text) + (1 if len(parts) > 1 else 0)
    if parts:
        chunks.append((",".join(parts), len(parts)))
    return chunks, too_big


@dataclass
class OutBatch:
    """One batch until sealed: its records as JSON text (``parts``, each an array's
    inside) and its blocks of step records (``blocks``, likewise); then ``text``."""

    seq: int
    nrecords: int
    nbytes: int
    parts: list[str] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    text: str | None = None  # the whole wire message, fixed once sent or spooled
    sent: bool = False
    acked: bool = False
    from_disk: bool = False


# How much may be unacknowledged in memory, by default: what bench/ingest.py's
# trainers keep in flight too.
WINDOW_BATCHES = 64
WINDOW_BYTES = 8 << 20


class Outbox:
    """Unacknowledged batches of one ``(run_id, rank)``; see the module docstring."""

    def __init__(
        self,
        spool_path: str | os.PathLike[str],
        hello: dict[str, Any],
        *,
        window_batches: int = WINDOW_BATCHES,
        window_bytes: int = WINDOW_BYTES,
        max_batch_bytes: int = 1 << 20,
    ) -> None:
        self.path = Path(spool_path)
        self.hello_text = dumps(hello)
        run_id, rank = dumps(hello["run_id"]), int(hello["rank"])
        self._prefix = f'{{"type":"batch","run_id":{run_id},"rank":{rank},"seq":'
        self.window_batches = window_batches
        self.window_bytes = window_bytes
        self.max_batch_bytes = max_batch_bytes
        self.memory: deque[OutBatch] = deque()
        self.memory_bytes = 0
        self.n_sent = 0  # memory[:n_sent] went out on the current connection
        self.disk: deque[tuple[int, int, int]] = deque()  # (seq, nrecords, nbytes) not yet read
        self.next_seq = 0
        self._writer: BinaryIO | None = None
        self._reader: BinaryIO | None = None
        self._read_offset = 0
        self._disk_last_seq = -1
        self.acked_batches = 0
        self.acked_records = 0
        self.spooled_batches = 0

    # -- state -------------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return self.pending_batches == 0

    @property
    def pending_batches(self) -> int:
        """Batches not yet acknowledged (an ack may come out of order, before the head's)."""
        return sum(1 for b in self.memory if not b.acked) + len(self.disk)

    def wire_text(self, seq: int, body: str, columns: str = "") -> str:
        """The batch message: ``body`` and ``columns`` are JSON arrays' insides."""
        if columns:
            return f'{self._prefix}{seq},"records":[{body}],"columns":[{columns}]}}'
        return f'{self._prefix}{seq},"records":[{body}]}}'

    def _seal(self, batch: OutBatch) -> str:
        batch.text = self.wire_text(batch.seq, ",".join(batch.parts), ",".join(batch.blocks))
        batch.parts, batch.blocks = [], []
        return batch.text

    def _room(self, nbytes: int) -> bool:
        if not self.memory:
            return True
        return (
            len(self.memory) < self.window_batches
            and self.memory_bytes + nbytes <= self.window_bytes
        )

    # -- adding ------------------------------------------------------------------------

    def add(self, body: str, nrecords: int, direct: bool, columns: str = "") -> None:
        """Queue encoded records: ``body`` is the inside of the ``records`` array,
        ``columns`` the inside of the ``columns`` array (block texts); ``nrecords``
        counts both.

        ``direct`` says the connection is up: then the batch may go to memory; it
        does only when no older batch waits on disk and the window has room.
        Raises OSError when the spool cannot be written (the caller warns).
        """
        nbytes = len(body) + len(columns)
        if direct and not self.disk and self._room(nbytes):
            tail = self.memory[-1] if self.memory else None
            if (
                tail is not None
                and tail.text is None
                and tail.nbytes + 2 + nbytes <= self.max_batch_bytes
                and tail.nrecords + nrecords <= MAX_RECORDS_PER_BATCH
            ):
                # Up to two commas join the two lists; counted as if both were there.
                if body:
                    tail.parts.append(body)
                if columns:
                    tail.blocks.append(columns)
                tail.nbytes += 2 + nbytes
                tail.nrecords += nrecords
                self.memory_bytes += 2 + nbytes
                return
            self.memory.append(
                OutBatch(
                    self.next_seq, nrecords, nbytes,
                    parts=[body] if body else [], blocks=[columns] if columns else [],
                )
            )
            self.memory_bytes += nbytes
            self.next_seq += 1
            return
        seq = self.next_seq
        text = self.wire_text(seq, body, columns)
        self._spool_line(text)
        self.next_seq += 1
        self.disk.append((seq, nrecords, len(text)))
        self._disk_last_seq = seq
        self.spooled_batches += 1

    def _spool_line(self, text: str) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            writer = open(self.path, "ab")  # noqa: SIM115 - kept open across calls
            lock_spool(writer)  # a restarted trainer leaves a live process's spool alone
            if writer.tell() == 0:
                hello = (self.hello_text + "\n").encode()
                writer.write(hello)
                self._read_offset = len(hello)
            self._writer = writer
        self._writer.write((text + "\n").encode())
        # Flush per batch: what reached the OS survives a crash of the training process.
        self._writer.flush()

    # -- sending -----------------------------------------------------------------------

    def restart(self) -> None:
        """A new connection: everything unacknowledged goes out again, in order."""
        self.n_sent = 0
        for batch in self.memory:
            batch.sent = False

    def next_to_send(self) -> OutBatch | None:
        """The oldest batch not yet sent on this connection (sealed), or None."""
        if self.n_sent < len(self.memory):
            batch = self.memory[self.n_sent]
        elif self.disk and self._room(self.disk[0][2]):
            batch = self._read_disk()
            self.memory.append(batch)
            self.memory_bytes += batch.nbytes
        else:
            return None
        if batch.text is None:
            self._seal(batch)
        batch.sent = True
        self.n_sent += 1
        return batch

    def _read_disk(self) -> OutBatch:
        seq, nrecords, nbytes = self.disk.popleft()
        if self._reader is None:
            self._reader = open(self.path, "rb")  # noqa: SIM115 - kept open across calls
        self._reader.seek(self._read_offset)
        line = self._reader.readline()
        self._read_offset += len(line)
        text = line.decode().rstrip("\n")
        return OutBatch(seq, nrecords, nbytes, text=text, from_disk=True)

    # -- acknowledgements --------------------------------------------------------------

    def ack(self, seq: int) -> bool:
        """Mark ``seq`` stored by the server; False for a repeat or unknown seq."""
        for batch in self.memory:
            if batch.seq == seq:
                if batch.acked:
                    return False
                batch.acked = True
                self.acked_batches += 1
                self.acked_records += batch.nrecords
                break
            if batch.seq > seq:
                return False
        else:
            return False
        self._drop_acked_head()
        return True

    def _drop_acked_head(self) -> None:
        while self.memory and self.memory[0].acked:
            self._pop_head()
        self._maybe_remove_spool()

    def _pop_head(self) -> OutBatch:
        batch = self.memory.popleft()
        self.memory_bytes -= batch.nbytes
        if self.n_sent > 0:
            self.n_sent -= 1
        return batch

    def reject_oldest_sent(self) -> OutBatch | None:
        """Take out the oldest batch sent on this connection and not acknowledged."""
        if self.n_sent == 0 or not self.memory:
            return None
        batch = self._pop_head()
        self._drop_acked_head()
        return batch

    def reject_sent(self, seq: int) -> OutBatch | None:
        """Take out batch ``seq`` when it went out on this connection, unacknowledged."""
        for index, batch in enumerate(self.memory):
            if batch.seq == seq and batch.sent and not batch.acked:
                del self.memory[index]
                self.memory_bytes -= batch.nbytes
                if index < self.n_sent:
                    self.n_sent -= 1
                self._drop_acked_head()
                return batch
        return None

    def _maybe_remove_spool(self) -> None:
        if self._writer is None or self.disk:
            return
        if self.memory and self.memory[0].seq <= self._disk_last_seq:
            return
        # Everything the file ever held is acknowledged: start afresh next time.
        self._close_files()
        self.path.unlink(missing_ok=True)

    def _close_files(self) -> None:
        for handle in (self._writer, self._reader):
            if handle is not None:
                handle.close()
        self._writer = self._reader = None

    # -- closing -----------------------------------------------------------------------

    def persist(self) -> tuple[int, int]:
        """Leave every unacknowledged batch in the spool, ``hello`` first, in order.

        Returns (batches, records) left there; with nothing left the file is removed.
        """
        if self.empty:
            self._close_files()
            if self._disk_last_seq >= 0:
                self.path.unlink(missing_ok=True)
            return 0, 0
        lines = [self.hello_text]
        records = 0
        unacked = [batch for batch in self.memory if not batch.acked]
        for batch in unacked:
            lines.append(batch.text if batch.text is not None else self._seal(batch))
            records += batch.nrecords
        tail = b""
        if self.disk:
            if self._writer is not None:
                self._writer.flush()
            with open(self.path, "rb") as f:
                f.seek(self._read_offset)
                tail = f.read()
            records += sum(n for _, n, _ in self.disk)
        self._close_files()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(("\n".join(lines) + "\n").encode())
            f.write(tail)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(unacked) + len(self.disk), records
