"""Tokens are matched whole and exactly, and a page on another local port is another
origin: near misses of each token (prefixes, extensions, case variants) are refused on
/ws/ingest, /ws/live and REST, and so are websockets from the same host on another
port. Each refusal is checked next to the exact value being accepted on the same
server, so a test that passes cannot be one where everything is refused."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest
from websockets.sync.client import connect

INGEST, VIEW = "ingest-Secret-7f3a", "view-Secret-91c2"


def near_misses(token: str) -> list[str]:
    """Values a token check must refuse that differ from ``token`` only a little."""
    return [
        token[:1],
        token[: len(token) // 2],
        token[:-1],  # every prefix up to one character short
        token + "x",
        token + token,  # extensions
        token.upper(),
        token.lower(),
        token.swapcase(),  # case variants
        "x" + token[1:],  # the same length, one character off
    ]


@pytest.fixture
def locked(gradwatch_server):
    return gradwatch_server(token=INGEST, view_token=VIEW)


def test_ingest_refuses_every_near_miss_of_the_ingest_token(locked, wire):
    run_id = wire.run_id()
    for token in [*near_misses(INGEST), *near_misses(VIEW), VIEW]:
        for query in (False, True):
            path = f"/ws/ingest?token={quote(token)}" if query else "/ws/ingest"
            with wire.connect(locked, path, token=None if query else token) as ws:
                error, code, _ = wire.expect_error(ws)
            assert code == 1008, (token, query)
            assert error["message"].startswith("expected the ingest token"), (token, error)
    assert wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST) == [
        {"type": "ack", "seq": 0, "live": False}
    ]
    with connect(f"{locked.url}/ws/ingest?token={quote(INGEST)}") as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 1, [wire.step(1)])))
        assert wire.recv(ws) == {"type": "ack", "seq": 1, "live": False}


def test_live_and_rest_refuse_every_near_miss_of_either_token(locked, wire):
    run_id = wire.run_id()
    wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST)
    for token in [*near_misses(VIEW), *near_misses(INGEST)]:
        assert wire.get(locked, "/api/runs", token=token)[0] == 401, token
        assert wire.get(locked, f"/api/runs/{run_id}?token={quote(token)}")[0] == 401, token
        assert wire.get(locked, f"/?token={quote(token)}")[0] == 401, token
        with wire.connect(locked, f"/ws/live?run={run_id}&token={quote(token)}") as viewer:
            error, code, _ = wire.expect_error(viewer)
        assert code == 1008, token
        assert "token" in error["message"], error
    for token in (VIEW, INGEST):
        assert [r["id"] for r in wire.get_ok(locked, "/api/runs", token=token)] == [run_id]
        assert wire.get(locked, f"/?token={quote(token)}")[0] == 200
        with wire.connect(locked, f"/ws/live?run={run_id}&token={quote(token)}") as viewer:
            assert wire.recv(viewer)["type"] == "subscribed"


def token_protocol(token: str) -> str:
    """The subprotocol a dashboard websocket offers its token as (client/js/api.js)."""
    return "gradwatch.token." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def test_a_token_offered_as_a_subprotocol_reads_live_and_never_writes(locked, wire):
    run_id = wire.run_id()
    wire.send_run(locked, run_id, [[wire.step(0)]], token=INGEST)
    live = f"{locked.url}/ws/live?run={run_id}"
    refused = [*map(token_protocol, near_misses(VIEW)), "gradwatch.token.", "gradwatch.token.!!"]
    for offer in refused:
        with connect(live, subprotocols=["gradwatch", offer], open_timeout=30) as viewer:
            error, code, _ = wire.expect_error(viewer)
        assert code == 1008 and "token" in error["message"], (offer, error)
    for token in (VIEW, INGEST, "\u00e9t\u00e9 / 2=1"):  # any text: base64url of its UTF-8
        offered = ["gradwatch", token_protocol(token)]
        with connect(live, subprotocols=offered, open_timeout=30) as viewer:
            if token in (VIEW, INGEST):
                assert viewer.subprotocol == "gradwatch"  # chosen: the token is not echoed
                assert wire.recv(viewer)["type"] == "subscribed"
            else:
                assert "got a wrong one" in wire.expect_error(viewer)[0]["message"]
    # a subprotocol only reads: the ingest token offered that way writes nothing
    offered = ["gradwatch", token_protocol(INGEST)]
    with connect(f"{locked.url}/ws/ingest", subprotocols=offered,
                 open_timeout=30) as trainer:
        error, code, _ = wire.expect_error(trainer)
    assert code == 1008 and error["message"].startswith("expected the ingest token"), error


def other_origins(server) -> list[str]:
    """Origins on the server's own host that are not the server's origin."""
    port = server.port
    return [
        f"http://127.0.0.1:{port + 1}",
        f"http://127.0.0.1:{port - 1}",
        f"http://127.0.0.1:{port}0",
        "http://127.0.0.1",
        "http://127.0.0.1:80",
        f"http://localhost:{port + 1}",
        f"http://127.0.0.2:{port}",
    ]


def test_websockets_from_another_port_on_the_same_host_are_refused(shared_gradwatch_server, wire):
    server = shared_gradwatch_server
    run_id = wire.run_id()
    for path in ("/ws/ingest", f"/ws/live?run={run_id}"):
        for origin in other_origins(server):
            with connect(server.url + path, origin=origin, open_timeout=30) as ws:
                error, code, _ = wire.expect_error(ws)
            assert code == 1008, (path, origin)
            assert error["message"] == (
                f"Origin: expected http://127.0.0.1:{server.port}, got {origin!r}"
            ), error
        # The server's own origin, on the same endpoint, is accepted.
        with connect(server.url + path, origin=server.http, open_timeout=30) as ws:
            if path == "/ws/ingest":
                ws.send(json.dumps(wire.hello(run_id)))
                ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)])))
                assert wire.recv(ws) == {"type": "ack", "seq": 0, "live": False}
            else:
                assert wire.recv(ws)["type"] == "subscribed"


def test_rest_grants_no_other_origin_a_read(shared_gradwatch_server, wire):
    """REST answers carry no CORS grant, so a page on another port cannot read them."""
    server = shared_gradwatch_server
    for origin in [*other_origins(server), server.http]:
        status, _, headers = wire.get(server, "/api/runs", headers={"Origin": origin})
        assert status == 200
        assert "access-control-allow-origin" not in headers, (origin, headers)
