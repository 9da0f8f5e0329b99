"""Blocks of step records in batches: cut to a batch's size (protocol/batching.py),
merged and spooled by the outbox, sent by the sender and counted by upload
(docs/PROTOCOL.md, ``columns``). The blocks themselves: test_columns.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol.batching import encode_blocks
from gradwatch.protocol.codec import dumps, loads
from gradwatch.protocol.columns import batch_records, from_columns, slice_block, to_columns
from gradwatch.protocol.messages import MAX_MESSAGE_BYTES
from gradwatch.protocol.outbox import Outbox
from gradwatch.protocol.sender import WebSocketSink
from gradwatch.protocol.spool import read_spool
from gradwatch.protocol.upload import upload
from gradwatch.protocol.warnings import GradwatchWarning


def test_a_block_over_the_batch_size_is_split_and_a_record_over_any_message_dropped() -> None:
    records = [
        {"kind": "step", "step": s, "loss": float(s), "timesteps": {"m": {"x": [0.5] * 1000}}}
        for s in range(40)
    ]
    _, blocks = to_columns(records)
    texts, too_big = encode_blocks(blocks, max_bytes=50_000)
    assert too_big == 0 and len(texts) > 1
    assert all(len(text) <= 50_000 for text, _ in texts)
    again = [r for text, n in texts for r in from_columns(loads(text))]
    assert [r["step"] for r in again] == list(range(40))
    assert sum(n for _, n in texts) == 40
    assert slice_block(blocks[0], 5, 7) == to_columns(records[5:7])[1][0]
    # 5 series of 100,000 timesteps (the most one may have): over 4 MiB as base64.
    huge = [
        {
            "kind": "step",
            "step": 0,
            "timesteps": {"m": {f"x{i}": [0.5] * 100_000 for i in range(5)}},
        }
    ]
    assert encode_blocks(to_columns(huge)[1], max_bytes=50_000) == ([], 1)
    assert len(dumps(to_columns(huge)[1][0])) > MAX_MESSAGE_BYTES


# -- outbox, sender, upload ------------------------------------------------------------


def test_outbox_merges_records_and_columns_of_two_adds_into_one_message(tmp_path: Path) -> None:
    hello = {"type": "hello", "protocol": 1, "run_id": "r", "rank": 0}
    box = Outbox(tmp_path / "s.jsonl", hello)
    first = to_columns([{"kind": "step", "step": 0, "loss": 1.0}])[1]
    second = to_columns([{"kind": "step", "step": 1, "t": 2.0}])[1]
    box.add('{"kind":"epoch","epoch":0}', 2, direct=True, columns=dumps(first[0]))
    box.add("", 1, direct=True, columns=dumps(second[0]))  # columns only
    box.add('{"kind":"end","status":"finished"}', 1, direct=True)  # records only
    batch = box.next_to_send()
    assert batch is not None and batch.nrecords == 4 and box.next_to_send() is None
    assert batch.text is not None
    message = loads(batch.text)
    # Its size counts both lists (the window and the merge limit see all of it).
    assert batch.nbytes >= len(dumps(message["records"])) + len(dumps(message["columns"])) - 4
    assert message["records"] == [
        {"kind": "epoch", "epoch": 0},
        {"kind": "end", "status": "finished"},
    ]
    assert message["columns"] == [first[0], second[0]]
    assert [r["step"] for r in batch_records(message) if r["kind"] == "step"] == [0, 1]


def test_outbox_writes_columns_only_when_a_batch_has_blocks(tmp_path: Path) -> None:
    hello = {"type": "hello", "protocol": 1, "run_id": "r", "rank": 0}
    box = Outbox(tmp_path / "s.jsonl", hello)
    box.add('{"kind":"epoch","epoch":0}', 1, direct=False)
    box.add("", 1, direct=False, columns=dumps(to_columns([{"kind": "step", "step": 7}])[1][0]))
    first, second = list(read_spool(tmp_path / "s.jsonl"))[1:]
    assert box.persist() == (2, 2)  # and the spool is closed
    assert "columns" not in first
    assert second["records"] == [] and [r["step"] for r in batch_records(second)] == [7]


def _mixed(start: int) -> list[dict[str, Any]]:
    return [
        {"kind": "step", "step": start, "loss": 0.5, "timesteps": {"m": {"x": [1.0, 2.0]}}},
        {"kind": "step", "step": start + 1, "loss": 0.25, "nonfinite": {"loss": True}},
        {"kind": "epoch", "epoch": 0, "step": start + 1},
    ]


def test_sender_sends_step_records_as_columns_and_the_rest_as_records(
    dead_port: int, hello: Any, tmp_path: Path
) -> None:
    spools = {}
    for columns in (True, False):
        spools[columns] = tmp_path / f"{columns}.jsonl"
        with pytest.warns(GradwatchWarning):
            sink = WebSocketSink(
                f"ws://127.0.0.1:{dead_port}",
                hello,
                spool=spools[columns],
                columns=columns,
                backoff_base=0.01,
            )
            sink.send(_mixed(0))
            sink.send(_mixed(10))
            sink.close(timeout=0.2)
    batches = [m for m in read_spool(spools[True]) if m["type"] == "batch"]
    assert [len(m["columns"]) for m in batches] == [1, 1]
    assert [[r["kind"] for r in m["records"]] for m in batches] == [["step", "epoch"]] * 2
    assert [[r["step"] for r in batch_records(m)] for m in batches] == [[1, 1, 0], [11, 11, 10]]
    plain = [m for m in read_spool(spools[False]) if m["type"] == "batch"]
    assert all("columns" not in m for m in plain)
    assert [r["step"] for m in plain for r in m["records"]] == [0, 1, 1, 10, 11, 11]


def test_upload_counts_and_delivers_the_records_of_blocks(
    dead_port: int, ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning):
        sink = WebSocketSink(f"ws://127.0.0.1:{dead_port}", hello, spool=spool, backoff_base=0.01)
        sink.send([*steps(0, 5), {"kind": "epoch", "epoch": 0}])
        sink.send(steps(5, 3))
        sink.close(timeout=0.2)
    assert any(m.get("columns") for m in read_spool(spool))
    result = upload(spool, ack_server.url)
    assert (result.batches, result.records, result.acked) == (2, 9, 2)
    assert [r["step"] for r in ack_server.records() if r["kind"] == "step"] == list(range(8))


def test_upload_refuses_columns_that_are_not_blocks(tmp_path: Path, hello: Any) -> None:
    from gradwatch.protocol.spool import SpoolError

    spool = tmp_path / "bad.jsonl"
    spool.write_text(
        json.dumps(hello)
        + "\n"
        + json.dumps(
            {
                "type": "batch",
                "run_id": hello["run_id"],
                "rank": 0,
                "seq": 0,
                "records": [],
                "columns": [{"kind": "step"}],
            }
        )
        + "\n"
    )
    with pytest.raises(SpoolError, match="expected columns as a list of blocks"):
        upload(spool, "ws://127.0.0.1:9")
