"""The listen side of live across replicas: a thread holding one PostgreSQL connection
that LISTENs on the deployment's channel and hands each other replica's notification
to a callback. What the notifications carry, and the SQL that sends them with each
batch's transaction, is storage (:mod:`gradwatch.server.store.postgres`); this thread
belongs to the serving side (server/replicas.py turns deliveries into live messages).

Example (what a replica does at startup; ``deliver`` is called on the listen thread):
    >>> listener = Listener(url, channel, replica, deliver=print)  # doctest: +SKIP
    >>> listener.start()     # returns once LISTEN is in place      # doctest: +SKIP
    >>> listener.stop()                                             # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger("gradwatch.server")

# The application_name of listen connections (pg_stat_activity) starts with this,
# followed by the channel: an operator sees which deployment a listener serves.
APP_NAME = "gradwatch-live"
# Seconds between liveness queries on an idle LISTEN connection.
PING_EVERY_S = 5.0


Delivery = tuple[str, Any]
"""``("note", payload dict)`` for another replica's notification, or ``("resync",
seconds)`` after the LISTEN connection came back: what may have been missed is what
was stored in the last ``seconds``."""


class Listener:
    """A daemon thread holding one autocommit connection that LISTENs on ``channel``.

    It hands every notification of another replica to ``deliver`` (on this thread), and
    reconnects when the connection drops (backoff 50 ms doubling to 5 s), then delivers
    ``("resync", seconds)`` so the receiver can read back what it missed.
    """

    def __init__(
        self, url: str, channel: str, replica: str, deliver: Callable[[Delivery], None]
    ) -> None:
        self.url = url
        self.channel = channel
        self.replica = replica
        self.deliver = deliver
        self.reconnects = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._warned: set[str] = set()
        # When the connection was last known to be listening (None: never yet).
        self._last_ok: float | None = None
        self._thread = threading.Thread(target=self._run, name="gradwatch-live-listen", daemon=True)

    @property
    def application_name(self) -> str:
        return f"{APP_NAME} {self.channel}"[:63]

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread; return once LISTEN is in place (TimeoutError otherwise)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"expected LISTEN {self.channel} within {timeout} s, got no answer")

    def stop(self) -> None:
        """End the thread (within about half a second). Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _warn_once(self, kind: str, error: BaseException) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("gradwatch live across replicas: %s: %s", kind, error)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self.url, autocommit=True, application_name=self.application_name
                )
            except Exception as error:
                self._warn_once("cannot connect to listen", error)
                self._stop.wait(backoff)  # a backoff between attempts, not synchronisation
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                with conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    if self._last_ok is not None:
                        self.reconnects += 1
                        # Margin: a batch committed just before the drop may not have
                        # been delivered yet when _last_ok was taken.
                        self.deliver(("resync", time.monotonic() - self._last_ok + 5.0))
                    self._ready.set()
                    backoff = 0.05
                    self._listen(conn)
            except Exception as error:
                self._warn_once("the LISTEN connection dropped; reconnecting", error)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        """Deliver notifications until stopped; raises when the connection is lost."""
        self._last_ok = pinged = time.monotonic()
        while not self._stop.is_set():
            for note in conn.notifies(timeout=0.5):
                self._hand(note.payload)
            now = time.monotonic()
            if now - pinged > PING_EVERY_S:  # a dead peer does not always close the socket
                conn.execute("SELECT 1")
                pinged = now
            self._last_ok = now

    def _hand(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            # Anyone who may connect can NOTIFY this channel: take only the shapes above.
            if (
                not isinstance(note, dict)
                or not isinstance(note.get("run"), str)
                or ("id" in note and type(note["id"]) is not int)
            ):
                raise ValueError(
                    f"expected a JSON object with run (and an integer id), got {payload[:80]!r}"
                )
        except ValueError as error:
            self._warn_once("an unreadable notification", error)
            return
        if note.get("r") == self.replica:
            return  # this replica's own batch: its viewers got it on the local fast path
        self.deliver(("note", note))
