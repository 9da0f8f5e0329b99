"""The websocket sink: records from the Monitor to the server, acknowledged and resent.

``send(records)`` (the Monitor's background thread) only encodes (step records as
``columns``, protocol/batching.py) and queues, in the
:class:`~gradwatch.protocol.outbox.Outbox`; one thread owns the connection
(protocol/connection.py): ``hello``, then the batches in ``seq`` order, several in
flight, each kept until its ``ack`` and resent after a reconnect. While the server is
away batches wait in the spool and reconnects back off with full jitter;
``close(timeout)`` leaves what is undelivered in the spool for ``gradwatch upload``.
Nothing raises into the caller; each kind of trouble is one ``GradwatchWarning``.
docs/DELIVERY.md tells the whole story.

Example:
    >>> sink = WebSocketSink("ws://127.0.0.1:8765", hello, spool="run.jsonl")  # doctest: +SKIP
    >>> sink.send([{"kind": "step", "step": 0, "epoch": 0, "t": 0.0}])  # doctest: +SKIP
    >>> sink.close(timeout=5)                                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from .backoff import Backoff
from .batching import encode_batches
from .connection import ConnectionThread
from .leftovers import leftovers, resend_in_background
from .messages import MAX_MESSAGE_BYTES
from .outbox import ENVELOPE_BYTES, WINDOW_BATCHES, WINDOW_BYTES, Outbox, encode_records
from .sink import with_session
from .spoolfiles import default_spool_path, fresh_path, rejected_path, upload_command
from .warnings import WarnOnce, say
from .wsclient import abort, ingest_url

__all__ = ["WebSocketSink", "default_spool_path", "encode_records", "rejected_path"]

DEFAULT_CLOSE_TIMEOUT = 10.0


class WebSocketSink(ConnectionThread):
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
        # whether the run has a live viewer, as the last ack said; True until one
        # does (the monitor then hands records over at the live pace)
        self.viewed = True
        self._session = 0
        self._ws = None
        self._server_error = None
        self._error_seq = None  # the seq an error names, when it names one
        self._closing = False
        self._closed = False
        self._stop = False
        self._deadline = float("inf")
        self.connections = 0
        self.failed_connects = 0  # attempts to connect that failed
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
        self._close_leftovers()
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
                "Send them later with: "
                + upload_command(self.spool_path, self.url, self.token is not None),
            )

    def _close_leftovers(self) -> None:
        """Give an earlier process's spools still being sent what is left of close()'s
        time; if that is not enough, say so: the process may end before they are sent
        (they stay where they are, and nothing else would tell)."""
        resender = self._resender
        if resender is None or not resender.is_alive():
            return
        resender.join(max(0.0, self._deadline - time.monotonic()))
        pending = [path for path in self.leftovers if path.exists()]
        if resender.is_alive() and pending:
            commands = "; ".join(
                upload_command(path, self.url, self.token is not None) for path in pending
            )
            self._warn.warn(
                "leftovers_unsent",
                f"gradwatch: the undelivered spool(s) of an earlier process were still being "
                f"sent to {self.url} when this one closed; what was not acknowledged stays "
                f"in them. Send them with: {commands}",
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
                "failed_connects": self.failed_connects,
            }

