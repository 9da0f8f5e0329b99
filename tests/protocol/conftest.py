"""A small but real websocket ingest server for the sender's tests.

It speaks the ingest side of protocol v1 (hello, batch -> ack, dedup by seq, error +
close code) over real sockets on 127.0.0.1, and can be told to misbehave: drop a
connection, refuse a seq, hold its acks, demand a token, go down and come back on
the same port. The end-to-end tests against the real server are in tests/server.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from gradwatch.protocol.codec import dumps, loads
from gradwatch.protocol.columns import batch_records


class AckServer:
    """Stores each (run_id, rank, seq) once and acks every batch, repeats included."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.stored: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        self.received: list[int] = []  # seq of every batch message, repeats included
        self.hellos: list[dict[str, Any]] = []
        self.headers: list[str | None] = []
        self.reject_seqs: set[int] = set()
        self.drop_after: int | None = None  # drop the connection after this many batches
        self.drop_at_seq: int | None = None  # drop, unanswered, the first time it comes
        self.token: str | None = None
        self.hello_error: str | None = None  # refuse every hello with this 1007 message
        self.name_seq_in_errors = False  # errors carry the refused batch's "seq"
        self.batch_error: str | None = None  # a refusal's message (naming no field)
        self.acks_held = threading.Event()  # set: receive but do not ack yet
        self.port = 0
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[ServerConnection] = set()
        self._held: list[tuple[ServerConnection, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = serve(self._handle, "127.0.0.1", self.port, compression=None, max_size=None)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self.drop_connections()
        self._server.shutdown()
        assert self._thread is not None
        self._thread.join(10)
        self._server = None

    def drop_connections(self) -> None:
        with self.cond:
            connections = list(self._connections)
        for ws in connections:
            with contextlib.suppress(OSError):
                ws.socket.shutdown(socket.SHUT_RDWR)

    def seqs(self) -> list[int]:
        with self.cond:
            return sorted(seq for (_, _, seq) in self.stored)

    def records(self) -> list[dict[str, Any]]:
        with self.cond:
            return [r for key in sorted(self.stored) for r in self.stored[key]]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout=timeout), "condition not reached in time"

    def release(self) -> None:
        """Stop holding acks: store and acknowledge what was held, in order."""
        with self.cond:
            self.acks_held.clear()
            held, self._held = self._held, []
        for ws, message in held:
            with contextlib.suppress(ConnectionClosed, OSError):
                self._store_and_ack(ws, message)

    def _store_and_ack(self, ws: ServerConnection, message: dict[str, Any]) -> None:
        seq = message["seq"]
        with self.cond:
            key = (message["run_id"], message["rank"], seq)
            if key not in self.stored:
                # A block's records as they would reach a viewer: JSON, "NaN" as text.
                self.stored[key] = loads(dumps(batch_records(message)))
            self.cond.notify_all()
        ws.send(dumps({"type": "ack", "seq": seq}))

    def _handle(self, ws: ServerConnection) -> None:
        with self.cond:
            self._connections.add(ws)
            self.headers.append(ws.request.headers.get("Authorization") if ws.request else None)
            self.cond.notify_all()
        try:
            if self.token is not None and self.headers[-1] != f"Bearer {self.token}":
                ws.send(dumps({"type": "error", "code": 1008, "message": "expected a token"}))
                ws.close(1008, "token")
                return
            hello = loads(ws.recv())
            with self.cond:
                self.hellos.append(hello)
                self.cond.notify_all()
            if self.hello_error is not None:
                ws.send(dumps({"type": "error", "code": 1007, "message": self.hello_error}))
                ws.close(1007, "bad hello")
                return
            count = 0
            for raw in ws:
                message = loads(raw)
                seq = message["seq"]
                count += 1
                with self.cond:
                    self.received.append(seq)
                    self.cond.notify_all()
                if seq == self.drop_at_seq:
                    self.drop_at_seq = None
                    ws.socket.shutdown(socket.SHUT_RDWR)  # as if the server died
                    return
                if seq in self.reject_seqs:
                    error: dict[str, Any] = {"type": "error", "code": 1007}
                    if self.name_seq_in_errors:
                        error.update(message=f"bad batch {seq}", seq=seq)
                    elif self.batch_error is not None:
                        error.update(message=self.batch_error)
                    else:
                        error.update(message=f"records[0].step: bad seq {seq}")
                    ws.send(dumps(error))
                    ws.close(1007, "bad batch")
                    return
                if self.drop_after is not None and count > self.drop_after:
                    self.drop_after = None
                    ws.socket.shutdown(socket.SHUT_RDWR)  # as if the server died
                    return
                with self.cond:
                    if self.acks_held.is_set():  # keep reading; release() acks them
                        self._held.append((ws, message))
                        continue
                self._store_and_ack(ws, message)
        except (ConnectionClosed, OSError):
            pass
        finally:
            with self.cond:
                self._connections.discard(ws)


@pytest.fixture
def ack_server() -> Iterator[AckServer]:
    server = AckServer()
    server.start()
    yield server
    server.release()
    server.stop()


@pytest.fixture
def start_ack_server() -> Iterator[Callable[[int], AckServer]]:
    """Starts an AckServer on a given port (say, where a sink has been knocking)."""
    servers: list[AckServer] = []

    def start(port: int) -> AckServer:
        server = AckServer()
        server.port = port
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def dead_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def make_hello(
    run_id: str = "00000000-0000-4000-8000-000000000001", rank: int = 0
) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": 1,
        "run_id": run_id,
        "run": "test-run",
        "rank": rank,
        "world_size": 1,
        "host": "localhost",
        "pid": 1,
        "model": {"modules": [], "parameters": 0, "recurrent": []},
        "config": {},
    }


def step_records(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "kind": "step",
            "step": s,
            "epoch": 0,
            "t": float(s),
            "duration_s": 0.01,
            "loss": 1.0 / (s + 1),
        }
        for s in range(start, start + count)
    ]


@pytest.fixture
def hello() -> dict[str, Any]:
    return make_hello()


@pytest.fixture
def steps() -> Callable[[int, int], list[dict[str, Any]]]:
    return step_records
