"""The websocket sink: records from the Monitor to the server, acknowledged and resent.

``send(records)`` (the Monitor's background thread) only encodes (step records as
``columns``, protocol/batching.py) and queues, in the
:class:`~gradwatch.protocol.outbox.Outbox`; one thread owns the connection: ``hello``,
then the batches in ``seq`` order, several in flight, each kept until its ``ack`` and
resent after a reconnect. While the server is away batches wait in the spool and
reconnects back off with full jitter; ``close(timeout)`` leaves what is undelivered
in the spool for ``gradwatch upload``. Nothing raises into the caller; each kind of
trouble is one ``GradwatchWarning``. docs/DELIVERY.md tells the whole story.

Example:
    >>> sink = WebSocketSink("ws://127.0.0.1:8765", hello, spool="run.jsonl")  # doctest: +SKIP
    >>> sink.send([{"kind": "step", "step": 0, "epoch": 0, "t": 0.0}])  # doctest: +SKIP
    >>> sink.close(timeout=5)                                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .backoff import Backoff
from .batching import encode_batches
from .blame import blames_a_batch
from .codec import loads
from .leftovers import leftovers, resend_in_background
from .messages import MAX_MESSAGE_BYTES
from .outbox import ENVELOPE_BYTES, WINDOW_BATCHES, WINDOW_BYTES, Outbox, encode_records
from .sink import with_session
from .spoolfiles import default_spool_path, fresh_path, rejected_path
from .warnings import WarnOnce
from .wsclient import abort, ingest_url, open_ingest, run_link

__all__ = ["WebSocketSink", "default_spool_path", "encode_records", "rejected_path"]

DEFAULT_CLOSE_TIMEOUT = 10.0


def say(line: str) -> None:
    """One line to stderr in one write: print() writes the text and its newline apart,
    so a line from the sender thread and one from the training thread could join."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

class WebSocketSink:
    """Streams batches to ``/ws/ingest`` with acks, resend, a disk spool and backoff.

    Args:
        url: ``ws://host:port`` (``/ws/ingest`` is appended when no path is given).
        hello: the run's ``hello`` message (docs/PROTOCOL.md); needs ``run_id``, ``rank``.
        token: sent as ``Authorization: Bearer <token>``.
        spool: the spool file; default ``.gradwatch/spool/<run_id>-rank<rank>.jsonl``.
        window_batches, window_bytes: how much may be unacknowledged in memory.
        max_batch_bytes: records queued while a batch waits are merged up to this size.
        backoff_base, backoff_cap: reconnect delays (seconds), full jitter.
        connect_timeout: seconds for one connection attempt.
        pack_series: send series in ``records`` packed (``{"f64": base64}``), not as lists.
        columns: step records as ``columns`` (docs/PROTOCOL.md; far cheaper for a server
            to parse); False: all in ``records``, for a server older than ``columns``.

    Example:
        >>> sink = WebSocketSink("ws://127.0.0.1:8765", hello)   # doctest: +SKIP
        >>> sink.send(records); sink.flush(timeout=5)             # doctest: +SKIP
        True
        >>> sink.close(timeout=5)                                 # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        hello: dict[str, Any],
        token: str | None = None,
        spool: str | os.PathLike[str] | None = None,
        *,
        window_batches: int = WINDOW_BATCHES,
        window_bytes: int = WINDOW_BYTES,
        max_batch_bytes: int = 1 << 20,
        backoff_base: float = 0.05,
        backoff_cap: float = 5.0,
        connect_timeout: float = 5.0,
        pack_series: bool = True,
        columns: bool = True,
        start: bool = True,
        announce: bool = True,
    ) -> None:
        self.url = ingest_url(url)
        # one line with the run's link at the first connection (rank 0 only);
        # announce=False or GRADWATCH_QUIET=1 silences it
        self.announce = announce and os.environ.get("GRADWATCH_QUIET", "") in ("", "0")
        if not isinstance(hello, dict) or "run_id" not in hello or "rank" not in hello:
            raise ValueError(f"expected a hello message with run_id and rank, got {hello!r}")
        self.token = token
        hello = with_session(hello)
        self.hello = hello
        chosen = Path(spool) if spool is not None else default_spool_path(hello)
        self.spool_path = fresh_path(chosen)
        # An earlier process's undelivered spool(s) at this path: sent in the background.
        self.leftovers = leftovers(chosen, self.spool_path)
        self.rejected_path = rejected_path(self.spool_path)
        self.max_batch_bytes = min(max_batch_bytes, MAX_MESSAGE_BYTES - ENVELOPE_BYTES)
        self.connect_timeout = connect_timeout
        # Timestep series travel packed ({"f64": base64}, docs/PROTOCOL.md) unless asked
        # otherwise: ~10x cheaper to encode here and to parse on the server.
        self.pack_series = pack_series
        self.columns = columns
        self._box = Outbox(
            self.spool_path,
            hello,
            window_batches=window_batches,
            window_bytes=window_bytes,
            max_batch_bytes=self.max_batch_bytes,
        )
        self._backoff = Backoff(backoff_base, backoff_cap)
        self._warn = WarnOnce()
        self._cond = threading.Condition()
        self._connected = False
        self._session = 0
        self._ws: ClientConnection | None = None
        self._server_error: tuple[int, str] | None = None
        self._error_seq: int | None = None  # the seq an error names, when it names one
        self._closing = False
        self._closed = False
        self._stop = False
        self._deadline = float("inf")
        self.connections = 0
        self.resent_batches = 0
        self.rejected_batches = 0
        self.dropped_records = 0
        # Batches the server stored without some field (their acks carried a notice).
        self.repaired_batches = 0
        # After close(): True when the server acknowledged everything, False when
        # batches were left in the spool. None before close().
        self.delivered: bool | None = None
        self._thread = threading.Thread(target=self._run, name="gradwatch-sender", daemon=True)
        self._resender: threading.Thread | None = None
        if start:
            self._thread.start()
            self._resender = resend_in_background(self.leftovers, self.url, token, self._warn)

    # -- the Sink interface ------------------------------------------------------------

    def send(self, records: list[dict[str, Any]]) -> None:
        """Queue one batch of records; returns at once, never raises."""
        if not records:
            return
        try:
            batches, dropped = encode_batches(
                records, self.max_batch_bytes, columns=self.columns, pack_series=self.pack_series
            )
        except Exception as e:
            self.dropped_records += len(records)
            self._warn.warn("encode", f"gradwatch: records could not be encoded as JSON ({e}); "
                            "they are dropped, training goes on")
            return
        if dropped:
            self.dropped_records += dropped
            self._warn.warn("too_big", f"gradwatch: {dropped} record(s) exceed the "
                            f"{MAX_MESSAGE_BYTES} byte message limit and are dropped")
        with self._cond:
            if self._closed:
                self.dropped_records += sum(n for _, _, n in batches)
                self._warn.warn("closed", "gradwatch: send() after close(); records dropped")
                return
            for body, columns, n in batches:
                try:
                    self._box.add(body, n, direct=self._connected, columns=columns)
                except OSError as e:
                    self.dropped_records += n
                    self._warn.warn("spool", f"gradwatch: cannot write the spool "
                                    f"{self.spool_path} ({e}); records that cannot be sent "
                                    "now are dropped, training goes on")
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every batch so far is acknowledged; False if ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._box.empty, timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver within ``timeout`` seconds (default 10); spool the rest, say where.

        Idempotent. Never raises.
        """
        limit = DEFAULT_CLOSE_TIMEOUT if timeout is None else max(0.0, timeout)
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._deadline = time.monotonic() + limit
            self._cond.notify_all()
            waiting = not self._connected and not self._box.empty and limit > 0
        if waiting and self.announce:
            # said before the wait, so a program that seems to hang at its end says why
            with contextlib.suppress(Exception):
                say(f"gradwatch: closing while {self.url} is not answering; waiting up to"
                    f" {limit:.0f} s for it (close(timeout=...)), then the rest stays in"
                    f" {self.spool_path}")
        if self._thread.is_alive():
            self._thread.join(limit)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            ws = self._ws
        if ws is not None:
            abort(ws)
        if self._thread.is_alive():
            self._thread.join(1.0)
        with self._cond:
            self._closed = True
            self.delivered = self._box.empty
            try:
                batches, records = self._box.persist()
            except OSError as e:
                batches, records = self._box.pending_batches, -1
                self._warn.warn("spool", f"gradwatch: cannot write the spool "
                                f"{self.spool_path} ({e}); {batches} batch(es) are lost")
                return
        if batches:
            self._warn.warn(
                "undelivered",
                f"gradwatch: {batches} batch(es) ({records} records) were not acknowledged by "
                f"{self.url} within {limit:.1f} s; they are kept in {self.spool_path}. "
                f"Send them later with: gradwatch upload {self.spool_path} --server {self.url}",
            )

    # -- introspection -----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def refused(self) -> int:
        """Batches the server refused, or stored only in part, so far."""
        return self.rejected_batches + self.repaired_batches

    def stats(self) -> dict[str, int]:
        """Counters: batches acked/spooled/resent/rejected/pending, records dropped."""
        with self._cond:
            return {
                "acked_batches": self._box.acked_batches,
                "acked_records": self._box.acked_records,
                "spooled_batches": self._box.spooled_batches,
                "pending_batches": self._box.pending_batches,
                "memory_batches": len(self._box.memory),
                "resent_batches": self.resent_batches,
                "rejected_batches": self.rejected_batches,
                "repaired_batches": self.repaired_batches,
                "dropped_records": self.dropped_records,
                "connections": self.connections,
            }

    # -- the connection thread ---------------------------------------------------------

    def _finished(self) -> bool:
        if self._stop:
            return True
        return self._closing and (self._box.empty or time.monotonic() >= self._deadline)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._finished():
                    return
                remaining = self._deadline - time.monotonic()
            try:
                ws = open_ingest(self.url, self.token, min(self.connect_timeout, remaining))
            except Exception as e:
                self._warn.warn("unreachable", f"gradwatch: cannot reach {self.url} ({e}); "
                                f"training goes on, records wait in {self.spool_path} and "
                                "are sent when the server is back")
                self._pause()
                continue
            outcome = "lost"
            try:
                outcome = self._serve(ws)
            except Exception as e:  # a bug here must not end delivery for good
                self._warn.warn("internal", f"gradwatch: sender error {e!r}; reconnecting")
            finally:
                if outcome == "done" and self._box.empty:
                    with contextlib.suppress(Exception):
                        ws.close()  # a clean goodbye: everything is acknowledged
                abort(ws)
                with self._cond:
                    self._connected = False
                    self._ws = None
            if outcome == "rejected":
                continue  # the server is fine; go on with the next batch at once
            if outcome != "done":
                self._pause()

    def _announce(self) -> None:
        link = run_link(self.url, str(self.hello["run_id"]), int(self.hello.get("rank", 0)))
        with contextlib.suppress(Exception):  # a closed stderr must not stop the sender
            say(f"gradwatch: streaming run {self.hello.get('run', '')} to {link}")

    def _pause(self) -> None:
        delay = self._backoff.next_delay()
        with self._cond:
            self._cond.wait_for(self._finished, timeout=delay)

    def _serve(self, ws: ClientConnection) -> str:
        """One connection: hello, then batches in order until it ends. Returns why."""
        with self._cond:
            if self._finished():
                return "done"
            self._session += 1
            session = self._session
            self._ws = ws
            self._server_error = None
            self._error_seq = None
            self.resent_batches += sum(1 for b in self._box.memory if b.sent)
            self._box.restart()
            self.connections += 1
            acked_before = self._box.acked_batches
        reader = threading.Thread(
            target=self._read, args=(ws, session), name="gradwatch-acks", daemon=True
        )
        try:
            ws.send(self._box.hello_text)
            with self._cond:
                self._connected = True
            if self.announce and self.connections == 1 and self.hello.get("rank", 0) == 0:
                self._announce()
            reader.start()
            while True:
                with self._cond:
                    while True:
                        if self._finished():
                            return "done"
                        if not self._connected or self._session != session:
                            return self._why_ended(acked_before)
                        batch = self._box.next_to_send()
                        if batch is not None:
                            break
                        self._cond.wait(self._wait_bound())
                    assert batch.text is not None
                    text = batch.text
                ws.send(text)
        except (ConnectionClosed, OSError):
            if reader.ident is None:  # refused right after the handshake
                reader.start()
            # Let the reader record an error message the server sent before closing.
            reader.join(2.0)
            with self._cond:
                return self._why_ended(acked_before)
        finally:
            with self._cond:
                self._connected = False
                self._cond.notify_all()

    def _wait_bound(self) -> float | None:
        if not self._closing:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def _why_ended(self, acked_before: int) -> str:
        """Called under the lock once a connection ended."""
        if self._box.acked_batches > acked_before:
            self._backoff.reset()  # it worked for a while: reconnect quickly
        error = self._server_error
        if error is None:
            self._warn.warn("lost", f"gradwatch: lost the connection to {self.url}; "
                            "reconnecting, nothing acknowledged is lost")
            return "lost"
        code, message = error
        acked_since = self._box.acked_batches > acked_before
        if blames_a_batch(code, message, self._error_seq, acked_since):  # protocol/blame.py
            if self._error_seq is not None:
                batch = self._box.reject_sent(self._error_seq)
            else:
                batch = self._box.reject_oldest_sent()
            if batch is not None:
                self._reject(batch, code, message)
                return "rejected"
        self._warn.warn("refused", f"gradwatch: {self.url} refused the connection "
                        f"(code {code}: {message}); retrying with backoff, records are kept")
        return "refused"

    def _reject(self, batch: Any, code: int, message: str) -> None:
        self.rejected_batches += 1
        try:
            self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.rejected_path, "a", encoding="utf-8") as f:
                f.write(batch.text + "\n")
            where = f"kept in {self.rejected_path}"
        except OSError as e:
            where = f"could not be kept ({e})"
        self._warn.warn("rejected", f"gradwatch: the server refused batch seq {batch.seq} "
                        f"for good (code {code}: {message}); it is {where}; "
                        "the following batches are sent on")

    def _read(self, ws: ClientConnection, session: int) -> None:
        """Reader of one connection: acks, and the server's error before it closes."""
        try:
            for raw in ws:
                try:
                    message = loads(raw)
                    kind = message.get("type") if isinstance(message, dict) else None
                except ValueError:
                    kind = None
                if kind == "ack" and isinstance(message.get("seq"), int):
                    notice = message.get("notice")
                    with self._cond:
                        if self._box.ack(message["seq"]) and notice:
                            self.repaired_batches += 1
                        self._cond.notify_all()
                    if notice:
                        self._warn.warn("notice", f"gradwatch: the server stored batch seq "
                                        f"{message['seq']} without what it could not accept "
                                        f"({str(notice)[:300]}); later such batches are "
                                        "counted in stats()['repaired_batches']")
                elif kind == "error":
                    seq = message.get("seq")
                    with self._cond:
                        self._server_error = (
                            int(message.get("code", 0) or 0),
                            str(message.get("message", "")),
                        )
                        named = isinstance(seq, int) and not isinstance(seq, bool)
                        self._error_seq = seq if named else None
        except (ConnectionClosed, OSError):
            pass
        finally:
            if ws.close_code is not None and ws.close_code in (1007, 1008, 1009):
                with self._cond:
                    if self._server_error is None:
                        self._server_error = (ws.close_code, ws.close_reason or "")
            with self._cond:
                if self._session == session:
                    self._connected = False
                self._cond.notify_all()
