"""docs/PROTOCOL.md names every message and field the server sends (issue 18, item
5): collected from a real server's real answers, not from a list kept by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gradwatch.server import live

DOC = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()


def _documented(name: str) -> bool:
    """`name` appears in the doc as code: `name`, "name": or `a.name`."""
    return bool(re.search(rf'(`|"|\.){re.escape(name)}(`|"|:)', DOC))


def _keys(message: dict[str, Any]) -> set[str]:
    return {str(message["type"]), *message}


def test_every_message_and_field_the_server_sends_is_in_protocol_md(
    shared_gradwatch_server: Any, wire: Any
) -> None:
    server = shared_gradwatch_server
    sent: set[str] = set()
    run_id = wire.run_id()
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer, \
            wire.connect(server, "/ws/live") as runs_list:
        sent |= _keys(wire.recv(viewer)) | _keys(wire.recv(runs_list))  # subscribed
        with wire.connect(server) as ws:
            hello = wire.hello(run_id)
            hello["model"]["full_names"] = {"m~0123456789abcdef~x": "m" * 300 + "x"}
            ws.send(json.dumps(hello))
            ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0, loss="x")])))
            ack = wire.recv(ws)
            assert "notice" in ack, ack
            sent |= _keys(ack) | {"full_names"}
            ws.send(json.dumps(wire.batch(run_id, 1, [{"kind": "step"}])))
            error, _, _ = wire.expect_error(ws)
            sent |= _keys(error)
        sent |= _keys(wire.recv(viewer))  # records
        sent |= _keys(wire.recv(runs_list))  # run
    # The lagged notices are built as text in server/live.py; their fields, from there.
    for text in re.findall(r"'(\{+\"type\":\"lagged\"[^']*)'", Path(live.__file__).read_text()):
        sent |= set(re.findall(r'"(\w+)":', text)) | {"lagged"}
    assert {"ack", "notice", "error", "seq", "subscribed", "records", "run", "lagged",
            "dropped", "closed"} <= sent, sent
    missing = sorted(name for name in sent if not _documented(name))
    assert missing == [], f"docs/PROTOCOL.md lacks {missing}"
