"""Tokens, Origin and Host checks, the CSP of pages, and `gradwatch serve`'s refusal
of an unprotected public bind."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect

INGEST, VIEW = "ingest-secret", "view-secret"


@pytest.fixture
def locked(gradwatch_server):
    return gradwatch_server(token=INGEST, view_token=VIEW)


def test_ingest_needs_the_ingest_token(locked, wire):
    for token, says in ((None, "got none"), ("guess", "got a wrong one"), (VIEW, "wrong one")):
        with wire.connect(locked, token=token) as ws:
            error, code, _ = wire.expect_error(ws)
        assert code == 1008
        assert error["message"].startswith("expected the ingest token")
        assert says in error["message"]
    run_id = wire.run_id()
    assert wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST) == [
        {"type": "ack", "seq": 0, "live": False}
    ]
    # ?token= works too: browsers and some proxies cannot set headers.
    with connect(f"{locked.url}/ws/ingest?token={INGEST}") as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 1, [wire.step(1)])))
        assert wire.recv(ws) == {"type": "ack", "seq": 1, "live": False}


def test_view_token_reads_but_cannot_write(locked, wire):
    run_id = wire.run_id()
    wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST)
    assert wire.get(locked, "/api/runs")[0] == 401
    assert wire.get(locked, "/api/runs", token="guess")[0] == 401
    status, body, _ = wire.get(locked, f"/api/runs/{run_id}")
    assert status == 401 and body["detail"].startswith("expected a view token")
    assert [r["id"] for r in wire.get_ok(locked, "/api/runs", token=VIEW)] == [run_id]
    assert wire.get_ok(locked, f"/api/runs?token={VIEW}")[0]["id"] == run_id
    assert wire.get_ok(locked, "/api/runs", token=INGEST)[0]["id"] == run_id
    with wire.connect(locked, f"/ws/live?run={run_id}&token={VIEW}") as viewer:
        assert wire.recv(viewer)["type"] == "subscribed"
    with wire.connect(locked, f"/ws/live?run={run_id}") as viewer:
        assert wire.expect_error(viewer)[1] == 1008
    # The page needs the link with its token; the health check stays open.
    assert wire.get(locked, "/")[0] == 401
    assert wire.get(locked, f"/?token={VIEW}")[0] == 200
    assert wire.get_ok(locked, "/api/health")["status"] == "ok"


def test_the_dashboards_cookie_reads_but_never_writes(locked, wire):
    run_id = wire.run_id()
    wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST)
    # Opening the page with ?token= sets the cookie: HttpOnly, SameSite=Strict, per port.
    status, _, headers = wire.get(locked, f"/?token={VIEW}")
    assert status == 200
    cookie = headers["set-cookie"]
    name = f"gradwatch_token_{locked.port}"
    assert cookie.startswith(f"{name}={VIEW};"), cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "set-cookie" not in wire.get(locked, "/api/health")[2]
    assert "set-cookie" not in wire.get(locked, f"/api/runs?token={VIEW}")[2]
    # It reads REST and /ws/live...
    jar = {"Cookie": f"{name}={VIEW}"}
    status, body, _ = wire.get(locked, "/api/runs", headers=jar)
    assert status == 200 and [r["id"] for r in body] == [run_id]
    assert wire.get(locked, "/", headers=jar)[0] == 200
    with connect(f"{locked.url}/ws/live?run={run_id}", additional_headers=jar) as viewer:
        assert wire.recv(viewer)["type"] == "subscribed"
    # ...under its own port's name only, and a wrong one reads nothing.
    assert wire.get(locked, "/api/runs", headers={"Cookie": f"gradwatch_token={VIEW}"})[0] == 401
    assert wire.get(locked, "/api/runs", headers={"Cookie": f"{name}=guess"})[0] == 401
    # Even holding the ingest token, a cookie never writes: it rides along by itself.
    admin = {"Cookie": f"{name}={INGEST}"}
    with connect(f"{locked.url}/ws/ingest", additional_headers=admin) as ws:
        error, code, _ = wire.expect_error(ws)
    assert code == 1008 and error["message"].startswith("expected the ingest token")
    request = urllib.request.Request(  # noqa: S310
        f"{locked.http}/api/runs/{run_id}/archived", method="PUT",
        data=b'{"archived": true}', headers={**admin, "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)  # noqa: S310
    refused.value.close()
    assert refused.value.code == 401


def test_the_cookie_is_secure_where_the_browser_came_over_tls(gradwatch_server, wire):
    # Behind the TLS proxy of docs/REMOTE.md the server itself speaks http: the proxy's
    # X-Forwarded-Proto (or an https --public-url) says the browser came over TLS. A
    # tunnel's or a LAN's plain http keeps a cookie the browser will store.
    proxied = {"Host": "gradwatch.example.org"}
    plain = gradwatch_server(token=INGEST, view_token=VIEW,
                             args=("--allowed-host", "gradwatch.example.org"))
    public = gradwatch_server(token=INGEST, view_token=VIEW,
                              args=("--public-url", "https://gradwatch.example.org"))
    for server, headers, secure in (
        (plain, {**proxied, "X-Forwarded-Proto": "https"}, True),
        (plain, {**proxied, "X-Forwarded-Proto": "http"}, False),
        (plain, proxied, False),
        (plain, {}, False),
        (public, {}, True),
    ):
        status, _, answer = wire.get(server, f"/?token={VIEW}", headers=headers)
        assert status == 200, headers
        assert ("; Secure" in answer["set-cookie"]) is secure, (headers, answer["set-cookie"])


def test_websocket_from_another_sites_page_is_refused(shared_gradwatch_server, wire):
    server = shared_gradwatch_server
    for path in ("/ws/ingest", "/ws/live"):
        with connect(server.url + path, origin="http://evil.example") as ws:
            error, code, _ = wire.expect_error(ws)
        assert code == 1008
        assert error["message"].startswith("Origin: expected http://127.0.0.1:")
    # The dashboard's own origin is fine.
    with connect(server.url + "/ws/live", origin=server.http) as ws:
        assert wire.recv(ws)["type"] == "subscribed"


def test_foreign_host_header_is_refused_against_dns_rebinding(shared_gradwatch_server, wire):
    server = shared_gradwatch_server
    status, body, _ = wire.get(server, "/api/runs", headers={"Host": "evil.example:8765"})
    assert status == 421
    assert "--allowed-host evil.example" in body["detail"]
    assert wire.get(server, "/api/runs", headers={"Host": f"localhost:{server.port}"})[0] == 200
    # A websocket handshake as a rebinding page's browser would send it.
    message = _first_websocket_message(server.port, host="evil.example", path="/ws/live")
    assert message["code"] == 1008
    assert message["message"].startswith("Host 'evil.example' is not allowed")


def _first_websocket_message(port: int, host: str, path: str) -> dict:
    """Handshake with an arbitrary Host header on a raw socket; the first text frame."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode())
        stream = sock.makefile("rb")
        assert stream.readline().startswith(b"HTTP/1.1 101")
        while stream.readline() not in (b"\r\n", b""):
            pass
        first, size = stream.read(2)
        assert first == 0x81  # one unfragmented text frame, unmasked from the server
        if size == 126:
            size = int.from_bytes(stream.read(2), "big")
        return dict(json.loads(stream.read(size)))


def test_allowed_host_is_accepted(gradwatch_server, wire):
    server = gradwatch_server(args=("--allowed-host", "gradwatch.lab"))
    assert wire.get(server, "/api/runs", headers={"Host": "gradwatch.lab"})[0] == 200
    assert wire.get(server, "/api/runs", headers={"Host": "other.lab"})[0] == 421


def test_pages_carry_a_content_security_policy(shared_gradwatch_server, wire):
    for path in ("/", "/api/runs", "/static/vendor/plotly.min.js"):
        status, _, headers = wire.get(shared_gradwatch_server, path)
        assert status == 200, path
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp
        # framed by itself and by pages on this machine (a Jupyter on any port), no other
        ancestors = csp.split("frame-ancestors ")[1].split(";")[0]
        assert ancestors.split() == ["'self'", "http://localhost:*", "http://127.0.0.1:*"]
        assert "x-frame-options" not in {k.lower() for k in headers}  # CSP decides
        assert "unsafe-eval" not in csp
        assert headers["referrer-policy"] == "no-referrer"
        assert headers["x-content-type-options"] == "nosniff"


def test_frame_ancestors_are_named_by_flag_or_variable_and_none_denies(gradwatch_server, wire):
    named = gradwatch_server(args=("--frame-ancestor", "https://hub.lab.example",
                                   "--frame-ancestor", "https://*.notebooks.example:*"))
    denied = gradwatch_server(env={"GRADWATCH_FRAME_ANCESTORS": "none"})
    for server, ancestors, deny in (
        (named, "'self' http://localhost:* http://127.0.0.1:* https://hub.lab.example"
                " https://*.notebooks.example:*", False),
        (denied, "'none'", True),
    ):
        for path in ("/", "/api/runs", "/no-such-page"):
            _, _, headers = wire.get(server, path)
            lower = {k.lower(): v for k, v in headers.items()}
            assert lower["content-security-policy"].endswith(f"; frame-ancestors {ancestors}")
            assert lower.get("x-frame-options") == ("DENY" if deny else None), path


@pytest.mark.parametrize("origin", ["https://hub.lab.example/user", "hub.lab.example",
                                    "http://[::1]:8888", "'self'; script-src *", "none none"])
def test_serve_refuses_a_frame_ancestor_that_is_not_an_origin(origin, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "serve", "--port", "9",
         "--db", str(tmp_path / "never.db"), "--frame-ancestor", origin],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "frame ancestor: expected an origin such as" in done.stderr, done.stderr
    assert not (tmp_path / "never.db").exists()


def test_plotly_is_served_from_the_installed_package(shared_gradwatch_server, wire):
    import plotly

    bundle = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    status, body, headers = wire.get(shared_gradwatch_server, "/static/vendor/plotly.min.js")
    assert status == 200
    assert headers["content-type"].startswith("text/javascript")
    assert body == bundle.read_text()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
def test_serve_refuses_a_public_bind_without_a_token(host, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradwatch.server.cli",
            "serve",
            "--host",
            host,
            "--port",
            "9",
            "--db",
            str(tmp_path / "never.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"--host {host} is reachable from other machines" in done.stderr
    assert "expected --token" in done.stderr
    assert not (tmp_path / "never.db").exists()
