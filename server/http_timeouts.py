"""HTTP connections that never finish their request headers are closed.

uvicorn times out an idle keep-alive connection, but not one that has sent part of
a request line or headers, nor one that connects and sends nothing: each such
connection holds a file descriptor for ever (21,000 of them exhausted a 20,000-fd
limit). :class:`TimedH11Protocol` gives every request's headers ``header_timeout``
seconds from the connection (or from the end of the previous response); a slow
sender that trickles a byte at a time does not restart the clock.

Example:
    >>> TimedH11Protocol.header_timeout
    10.0
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers."""

    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _waiting_for_headers(self) -> bool:
        busy = self.cycle is not None and not self.cycle.response_complete
        return not busy and self.conn.their_state is h11.IDLE

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm()  # not re-armed when already running: trickling buys no time
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle now: uvicorn's keep-alive timeout takes over

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with_timeout(seconds: float) -> type[TimedH11Protocol]:
    """:class:`TimedH11Protocol` with its headers deadline set to ``seconds``.

    The class itself (importable by name, so ``--workers`` processes can load it);
    each worker sets the deadline again from its settings (server/cli.py).
    """
    TimedH11Protocol.header_timeout = float(seconds)
    return TimedH11Protocol
