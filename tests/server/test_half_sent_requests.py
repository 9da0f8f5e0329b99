"""Half-sent HTTP requests are timed out (issue 18, item 7): raw sockets that send
part of a request, trickle bytes, or nothing at all, against a real server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server ends the connection before ``deadline`` (reads until EOF)."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(0.5, deadline - time.monotonic())))
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
    return False


def test_half_sent_requests_are_closed_and_the_server_keeps_serving(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server(env={"GRADWATCH_HEADER_TIMEOUT_S": "1"})
    run_id = wire.run_id()
    socks: list[socket.socket] = []
    with wire.connect(server) as trainer:  # a websocket is not a half-sent request
        trainer.send(json.dumps(wire.hello(run_id)))
        try:
            for i in range(30):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                socks.append(sock)
                if i % 3 == 1:
                    sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                elif i % 3 == 2:
                    sock.sendall(b"GET /api/he")
            trickler = socks[2]
            deadline = time.monotonic() + 15
            # A trickle of one byte at a time does not buy more time.
            for byte in b"alth HTTP/1.1\r\nX-Slow: 1":
                try:
                    trickler.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.1)  # the pace of a slow sender, not synchronisation
            for sock in socks:
                assert closed_by_server(sock, deadline), "a half-sent request is still open"
            assert server.health() is not None
            trainer.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)])))
            assert wire.recv(trainer) == {"type": "ack", "seq": 0, "live": False}
        finally:
            for sock in socks:
                sock.close()
    # A complete request on a fresh connection is answered as before.
    assert wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")["fields"]["loss"][
        "step"] == [0]
