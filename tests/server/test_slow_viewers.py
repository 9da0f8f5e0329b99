"""A viewer that never reads is dropped once it is behind by more than the byte bound;
ingest and a viewer that reads are untouched (issue 18, item 5). A real server, a
raw-socket viewer that stops reading after the handshake, real websockets."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed

LIMIT = 2 << 20  # bytes a viewer may be behind
SERIES = 8_000  # float64 values per batch: ~85 KB of base64 in each live message
BATCHES = 200  # ~17 MB in all: 8x the bound, more than the sockets' buffers hold


def slow_viewer(server: Any, run_id: str) -> socket.socket:
    """A websocket viewer on a raw socket with a tiny receive buffer that never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /ws/live?run={run_id} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "the server closed during the handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def big_step(step: int) -> dict[str, Any]:
    values = struct.pack(f"<{SERIES}d", *(float(i % 97) for i in range(SERIES)))
    return {"kind": "step", "step": step, "loss": 1.0,
            "timesteps": {"lstm1": {"input": {"f64": base64.b64encode(values).decode()}}}}


def test_a_viewer_that_never_reads_is_dropped_and_nothing_else_slows(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server(env={"GRADWATCH_LIVE_QUEUE_BYTES": str(LIMIT)})
    run_id = wire.run_id()
    with wire.connect(server) as ws:  # the run exists before the viewers subscribe
        ws.send(json.dumps(wire.hello(run_id)))
    stuck = slow_viewer(server, run_id)
    got: list[int] = []

    def read(reader: Any) -> None:
        try:
            while True:
                message = json.loads(reader.recv(timeout=60))
                if message.get("type") == "records":
                    got.extend(r["step"] for r in message["records"])
        except (ConnectionClosed, TimeoutError):
            pass

    with wire.connect(server, f"/ws/live?run={run_id}") as reader:
        assert wire.recv(reader)["type"] == "subscribed"
        thread = threading.Thread(target=read, args=(reader,), daemon=True)
        thread.start()
        try:
            _ingest_and_watch(server, wire, run_id, stuck, got)
        finally:
            stuck.close()
            reader.close()
            thread.join(10)


def _ingest_and_watch(server: Any, wire: Any, run_id: str, stuck: socket.socket,
                      got: list[int]) -> None:
    """BATCHES batches in rounds of 20; the reader gets all, the stuck viewer is dropped."""
    for first in range(0, BATCHES, 20):
        batches = [[big_step(step)] for step in range(first, first + 20)]
        acks = wire.send_run(server, run_id, batches, first_seq=first)
        assert [a["seq"] for a in acks] == list(range(first, first + 20))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(got) < BATCHES:
        time.sleep(0.05)  # polling a condition with a deadline
    assert got == list(range(BATCHES))  # the viewer that reads lost nothing
    # The one that never read was dropped: its connection ends (EOF or reset) even
    # though nothing told the server to close; before, it stayed open for ever.
    ended = False
    received = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ended:
        try:
            chunk = stuck.recv(1 << 16)
        except ConnectionResetError:
            ended = True
            break
        except TimeoutError:
            break
        ended = not chunk
        received += len(chunk)
    assert ended, f"the slow viewer is still connected after {received} bytes"
    assert received < BATCHES * SERIES * 8  # it was not sent everything
