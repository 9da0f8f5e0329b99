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


def _table(heading: str) -> set[str]:
    """The names in the first column of the first table after ``heading`` (a row may
    name several: "`epoch`, `graph_nodes`"; "`model.modules`" keeps its prefix)."""
    lines = DOC.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return {name for cell in rows for name in re.findall(r"`([\w.]+)`", cell)}


def test_the_field_tables_of_protocol_md_are_the_fields_the_code_knows() -> None:
    """What the tables list is what the trainer sends and the server validates: a
    field added to (or dropped from) the code without the doc fails here."""
    from gradwatch.protocol import messages as m
    from gradwatch.server import schema

    hello = {*schema.Hello.model_fields} - {"type", "model"}
    hello |= {f"model.{name}" for name in schema.ModelInfo.model_fields}
    # full_names: an extension the trainer sends (trainer_hooks/identity.py) and the
    # server keeps as an unknown field of the model
    assert _table("### `hello`") == hello | {"model.full_names"}
    step = {*m.StepRecord.__annotations__} - {"kind"}
    assert {*schema.StepRecord.model_fields} - {"kind"} <= step
    assert _table("### `step`") == step
    assert _table("#### `columns`") == {*schema.StepColumns.model_fields}


def test_the_limits_and_codes_in_protocol_md_are_the_codes() -> None:
    from gradwatch.protocol import messages as m
    from gradwatch.server.repair import MAX_NOTICES

    flat = " ".join(DOC.split())  # sentences wrap anywhere
    assert f"at most **{m.MAX_MESSAGE_BYTES >> 20} MiB** (`MAX_MESSAGE_BYTES`)" in flat
    assert f"a batch holds at most {m.MAX_RECORDS_PER_BATCH:,} records" in flat
    assert f"are at most {m.MAX_NAME_CHARS} characters" in flat
    assert (f"at most {m.MAX_TIMESTEPS:,} entries ({8 * m.MAX_TIMESTEPS:,} bytes packed)"
            in flat)
    assert f"| int, 1 … {m.MAX_RECORDS_PER_BATCH:,} |" in flat
    assert f"(at most {MAX_NOTICES}, then `and N more`)" in flat
    codes = flat.split("`code` is one of ", 1)[1].split(" (", 1)[0]
    assert tuple(re.findall(r"`(\w+)`", codes)) == m.ALERT_CODES
