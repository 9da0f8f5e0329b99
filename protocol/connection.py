"""The sender's connection thread: one websocket at a time, hello, then batches in order.

:class:`~gradwatch.protocol.sender.WebSocketSink` has two halves around one lock
(``_cond``) and one :class:`~gradwatch.protocol.outbox.Outbox`. The caller's half
(protocol/sender.py: ``send``, ``flush``, ``close``, ``stats``) only encodes, queues and
waits. This half runs on the ``gradwatch-sender`` thread the sink starts, with a
``gradwatch-acks`` reader per connection: it connects, sends ``hello`` and every
unacknowledged batch in ``seq`` order (several in flight), counts the acks, sets aside
a batch the server refuses for good (protocol/blame.py says which) and, after a lost or
refused connection, backs off with full jitter (protocol/backoff.py) and connects again.
docs/DELIVERY.md tells the whole story.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .backoff import Backoff
from .blame import blames_a_batch
from .codec import loads
from .outbox import Outbox
from .warnings import WarnOnce, say
from .wsclient import abort, open_ingest, run_link


class ConnectionThread:
    """The connection thread's part of :class:`~gradwatch.protocol.sender.WebSocketSink`.

    Not used alone: the sink sets every attribute below in its ``__init__`` and starts
    ``_run`` on its thread. Attributes both threads touch are read and written under
    ``_cond``.
    """

    url: str
    token: str | None
    hello: dict[str, Any]
    announce: bool
    connect_timeout: float
    spool_path: Path
    rejected_path: Path
    connections: int
    resent_batches: int
    rejected_batches: int
    repaired_batches: int
    _box: Outbox
    _backoff: Backoff
    failed_connects: int
    _warn: WarnOnce
    _cond: threading.Condition
    _connected: bool
    #: whether someone watches the run live, as the server's last ack said (True until
    #: a server says: one older than the ``live`` field never does)
    viewed: bool
    _session: int
    _ws: ClientConnection | None
    _server_error: tuple[int, str] | None
    _error_seq: int | None  # the seq an error names, when it names one
    _closing: bool
    _stop: bool
    _deadline: float

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
                self._warn.warn(
                    "unreachable",
                    f"gradwatch: cannot reach {self.url} ({e}); "
                    f"training goes on, records wait in {self.spool_path} and "
                    "are sent when the server is back",
                )
                with self._cond:
                    self.failed_connects += 1
                    self._cond.notify_all()
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
            self.viewed = True  # another server, maybe an older one: until it says
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
            self._warn.warn(
                "lost",
                f"gradwatch: lost the connection to {self.url}; "
                "reconnecting, nothing acknowledged is lost",
            )
            return "lost"
        code, message = error
        hello_accepted = self._box.acked_batches > 0  # this hello, on any connection
        if blames_a_batch(code, message, self._error_seq, hello_accepted):  # protocol/blame.py
            if self._error_seq is not None:
                batch = self._box.reject_sent(self._error_seq)
            else:
                batch = self._box.reject_oldest_sent()
            if batch is not None:
                self._reject(batch, code, message)
                return "rejected"
        self._warn.warn(
            "refused",
            f"gradwatch: {self.url} refused the connection "
            f"(code {code}: {message}); retrying with backoff, records are kept",
        )
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
        self._warn.warn(
            "rejected",
            f"gradwatch: the server refused batch seq {batch.seq} "
            f"for good (code {code}: {message}); it is {where}; "
            "the following batches are sent on",
        )

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
                    live = message.get("live")
                    if isinstance(live, bool):
                        self.viewed = live  # one bool, read by the monitor: no lock
                    notice = message.get("notice")
                    with self._cond:
                        if self._box.ack(message["seq"]) and notice:
                            self.repaired_batches += 1
                        self._cond.notify_all()
                    if notice:
                        self._warn.warn(
                            "notice",
                            f"gradwatch: the server stored batch seq "
                            f"{message['seq']} without what it could not accept "
                            f"({str(notice)[:300]}); later such batches are "
                            "counted in stats()['repaired_batches']",
                        )
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
