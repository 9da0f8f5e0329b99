"""WebSocketSink against a real websocket server on 127.0.0.1 (tests/protocol/conftest.py)."""

from __future__ import annotations

import base64
import math
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol.columns import batch_records
from gradwatch.protocol.sender import WebSocketSink, encode_records
from gradwatch.protocol.spool import read_spool
from gradwatch.protocol.warnings import GradwatchWarning


def test_every_record_arrives_once_in_order(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    sink = WebSocketSink(ack_server.url, hello, spool=tmp_path / "run.jsonl")
    for i in range(300):
        sink.send(steps(i * 2, 2))
    assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert sink.delivered is True
    seqs = ack_server.seqs()
    assert seqs == list(range(len(seqs)))  # seq counts from 0, no gap
    assert [r["step"] for r in ack_server.records()] == list(range(600))
    # the hello as given, plus a session of this sender's own (resumed processes differ)
    assert ack_server.hellos[0] == {**hello, "session": sink.hello["session"]}
    assert len(sink.hello["session"]) == 36
    assert not (tmp_path / "run.jsonl").exists()  # nothing left to upload


def test_batches_are_pipelined_not_stop_and_wait(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.acks_held.set()
    sink = WebSocketSink(
        ack_server.url, hello, spool=tmp_path / "run.jsonl", window_batches=8, max_batch_bytes=10
    )
    ack_server.wait_for(lambda: len(ack_server.hellos) == 1)
    for i in range(40):
        sink.send(steps(i, 1))
    # Eight batches reach the server while none is acknowledged: a window, not one at a time.
    ack_server.wait_for(lambda: len(ack_server.received) >= 8)
    # Memory holds the window; the rest waits on disk until acks free it.
    stats = sink.stats()
    assert stats["memory_batches"] <= 8 and stats["spooled_batches"] >= 32
    assert stats["pending_batches"] == 40  # none acknowledged, none lost
    assert ack_server.records() == []
    ack_server.release()
    assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert [r["step"] for r in ack_server.records()] == list(range(40))


def test_unacknowledged_batches_are_resent_after_connection_loss(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.drop_after = 5
    with pytest.warns(GradwatchWarning, match="lost the connection"):
        sink = WebSocketSink(
            ack_server.url, hello, spool=tmp_path / "run.jsonl", backoff_base=0.01,
            max_batch_bytes=1,
        )
        for i in range(50):
            sink.send(steps(i, 1))
            if i == 10:
                ack_server.wait_for(lambda: len(ack_server.received) > 5)
        assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert len(ack_server.hellos) == 2  # hello again on the new connection
    assert [r["step"] for r in ack_server.records()] == list(range(50))
    assert sink.stats()["resent_batches"] >= 1
    # The dropped batch reached the server twice; it was stored once.
    assert len(ack_server.received) > len(ack_server.seqs())


def test_server_down_at_start_spools_with_bounded_memory_then_delivers(
    dead_port: int, start_ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    sink = WebSocketSink(
        f"ws://127.0.0.1:{dead_port}", hello, spool=spool, window_batches=4, backoff_cap=0.2
    )
    try:
        with pytest.warns(GradwatchWarning, match="cannot reach"):
            for i in range(500):  # all return: nothing waits on the network
                sink.send(steps(i, 1))
            stats = sink.stats()
            assert stats["memory_batches"] == 0 and stats["spooled_batches"] == 500
            # Durable before any close: what a crash right now would leave behind.
            messages = list(read_spool(spool))
            assert messages[0] == sink.hello
            assert [m["seq"] for m in messages[1:]] == list(range(500))
            # the server comes up only once the sender has found it down
            with sink._cond:
                assert sink._cond.wait_for(lambda: sink.failed_connects >= 1, timeout=30)
            server = start_ack_server(dead_port)
            assert sink.flush(timeout=60)
        assert sink.stats()["failed_connects"] >= 1
    finally:
        sink.close(timeout=5)  # a failed assertion must not leave its thread reconnecting
    assert [r["step"] for r in server.records()] == list(range(500))
    assert server.seqs() == list(range(500))
    assert not spool.exists()  # all acknowledged: the spool is gone


def test_close_leaves_undelivered_batches_in_spool_hello_first(
    dead_port: int, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning) as caught:
        sink = WebSocketSink(f"ws://127.0.0.1:{dead_port}", hello, spool=spool, window_batches=4)
        for i in range(30):
            sink.send(steps(i, 1))
        sink.close(timeout=0.5)
    assert sink.delivered is False
    messages = list(read_spool(spool))
    assert messages[0] == sink.hello  # with its session, so an upload dedups against it
    assert [m["seq"] for m in messages[1:]] == list(range(30))
    assert [batch_records(m)[0]["step"] for m in messages[1:]] == list(range(30))
    texts = [str(w.message) for w in caught]
    assert any(str(spool) in t and "gradwatch upload" in t for t in texts), texts
    assert not any("--token" in t for t in texts), texts  # the sender had none
    assert any("cannot reach" in t for t in texts), texts
    # Each kind of trouble is reported once, however many reconnects failed.
    assert len(texts) == len(set(texts))


def test_rejected_batch_is_set_aside_and_the_rest_delivered(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.reject_seqs = {3}
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning, match="refused batch seq 3"):
        sink = WebSocketSink(ack_server.url, hello, spool=spool, window_batches=1)
        for i in range(10):
            sink.send(steps(i, 1))
        assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert ack_server.seqs() == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    rejected = list(read_spool(tmp_path / "run.rejected.jsonl"))
    assert [m["seq"] for m in rejected] == [3]
    assert batch_records(rejected[0])[0]["step"] == 3
    assert sink.stats()["rejected_batches"] == 1


def test_a_batch_refused_first_on_a_new_connection_is_set_aside_once_the_hello_was_accepted(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    """The connection dies as batch 3 arrives; on the next one batch 3 goes first and an
    error naming nothing refuses it. The same hello was accepted before (0-2 were
    acknowledged), so the error is batch 3's, not the hello's: it is set aside instead
    of the sender reconnecting and being refused forever."""
    ack_server.batch_error = "the store refused this data"
    ack_server.reject_seqs = {3}
    ack_server.drop_at_seq = 3
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning) as caught:  # the lost connection, the refusal
        sink = WebSocketSink(
            ack_server.url, hello, spool=spool, window_batches=1, backoff_base=0.01
        )
        for i in range(6):
            sink.send(steps(i, 1))
        assert sink.flush(timeout=20)
    sink.close(timeout=5)
    assert any("refused batch seq 3" in str(w.message) for w in caught)
    assert not any("refused the connection" in str(w.message) for w in caught)
    assert ack_server.seqs() == [0, 1, 2, 4, 5]
    assert ack_server.received[:5] == [0, 1, 2, 3, 3]  # 3 dropped, then 3 refused
    assert [m["seq"] for m in read_spool(tmp_path / "run.rejected.jsonl")] == [3]


def test_an_error_naming_its_seq_sets_exactly_that_batch_aside(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    """The optional "seq" of an error wins over the oldest-in-flight rule: here the
    refused batch is the first on its connection and the message names no records."""
    ack_server.acks_held.set()
    ack_server.name_seq_in_errors = True
    ack_server.reject_seqs = {2}
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning, match="refused batch seq 2"):
        sink = WebSocketSink(ack_server.url, hello, spool=spool, max_batch_bytes=1)
        for i in range(6):
            sink.send(steps(i, 1))
        ack_server.wait_for(lambda: 2 in ack_server.received)  # 0, 1 in flight, unacked
        ack_server.release()
        assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert ack_server.seqs() == [0, 1, 3, 4, 5]
    assert [m["seq"] for m in read_spool(tmp_path / "run.rejected.jsonl")] == [2]


def test_a_refused_hello_drops_no_batch(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    """Regression: a 1007 about the hello must not be blamed on batch after batch."""
    ack_server.hello_error = "run: expected at most 256 characters, got 300"
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning) as caught:
        sink = WebSocketSink(ack_server.url, hello, spool=spool, backoff_base=0.01)
        for i in range(5):
            sink.send(steps(i, 1))
        ack_server.wait_for(lambda: len(ack_server.hellos) >= 3)  # it keeps trying
        sink.close(timeout=0.2)
    assert sink.stats()["rejected_batches"] == 0
    assert not (tmp_path / "run.rejected.jsonl").exists()
    assert any("refused the connection" in str(w.message) for w in caught)
    records = [r for m in read_spool(spool) if m["type"] == "batch" for r in batch_records(m)]
    assert [r["step"] for r in records] == list(range(5))


def test_token_travels_as_bearer_header(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.token = "s3cret"
    sink = WebSocketSink(ack_server.url, hello, token="s3cret", spool=tmp_path / "run.jsonl")
    sink.send(steps(0, 3))
    assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert ack_server.headers[0] == "Bearer s3cret"
    assert len(ack_server.records()) == 3


def test_refused_token_keeps_records_and_warns_once(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.token = "right"
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning) as caught:
        sink = WebSocketSink(ack_server.url, hello, token="wrong", spool=spool, backoff_base=0.01)
        sink.send(steps(0, 5))
        ack_server.wait_for(lambda: len(ack_server.headers) >= 3)  # it keeps trying
        sink.close(timeout=0.2)
    assert sum("refused the connection" in str(w.message) for w in caught) == 1
    assert [m["type"] for m in read_spool(spool)] == ["hello", "batch"]
    assert ack_server.records() == []


def test_send_never_raises_on_records_that_are_not_json(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    sink = WebSocketSink(ack_server.url, hello, spool=tmp_path / "run.jsonl")
    with pytest.warns(GradwatchWarning, match="could not be encoded"):
        sink.send([{"kind": "step", "step": 0, "loss": object()}])
    sink.send(steps(1, 1))
    assert sink.flush(timeout=30)
    sink.close(timeout=5)
    assert [r["step"] for r in ack_server.records()] == [1]
    assert sink.stats()["dropped_records"] == 1


def test_nonfinite_numbers_travel_as_strings(ack_server: Any, hello: Any, tmp_path: Path) -> None:
    sink = WebSocketSink(ack_server.url, hello, spool=tmp_path / "run.jsonl")
    sink.send([{"kind": "step", "step": 0, "loss": float("nan"), "total_norm": float("inf")}])
    assert sink.flush(timeout=30)
    sink.close(timeout=5)
    (record,) = ack_server.records()
    assert record["loss"] == "NaN" and record["total_norm"] == "Infinity"


def test_timestep_series_travel_packed_unless_asked_otherwise(
    ack_server: Any, hello: Any, tmp_path: Path
) -> None:
    values = [0.5, 1e-300, math.nan, math.inf]
    record = {"kind": "step", "step": 0, "timesteps": {"lstm": {"input": values}}}
    for pack in (True, False):
        run = {**hello, "run_id": f"{hello['run_id']}-{pack}"}  # each its own seq 0
        # Lists travel only in `records`: blocks of `columns` always hold packed series.
        sink = WebSocketSink(
            ack_server.url, run, spool=tmp_path / f"{pack}.jsonl", pack_series=pack,
            columns=False,
        )
        sink.send([record])
        assert sink.flush(timeout=30)
        sink.close(timeout=5)
    got = [r["timesteps"]["lstm"]["input"] for r in ack_server.records()]
    (packed,) = [g for g in got if isinstance(g, dict)]
    (listed,) = [g for g in got if isinstance(g, list)]
    raw = base64.b64decode(packed["f64"], validate=True)
    assert raw == struct.pack("<4d", *values)
    assert listed == [0.5, 1e-300, "NaN", "Infinity"]
    assert record["timesteps"]["lstm"]["input"] is values  # the caller's record is untouched


def test_big_sends_are_split_within_the_batch_limits(hello: Any, steps: Any) -> None:
    records = steps(0, 25_000)
    chunks, too_big = encode_records(records, max_bytes=200_000)
    assert too_big == []
    assert sum(n for _, n in chunks) == 25_000
    assert all(len(text) <= 200_000 and n <= 10_000 for text, n in chunks)
    # Over max_bytes but within the 4 MiB message limit: a batch of its own.
    big = {"kind": "step", "step": 0, "timesteps": {"m": {"input": [1.0] * 100_000}}}
    chunks, too_big = encode_records([*steps(0, 1), big, *steps(1, 1)], max_bytes=200_000)
    assert too_big == [] and [n for _, n in chunks] == [1, 1, 1]
    # Over the message limit: no server would take it; dropped (the sink warns).
    huge = {"kind": "step", "step": 0, "timesteps": {"m": {"input": [1.0] * 2_000_000}}}
    chunks, too_big = encode_records([huge, *steps(1, 1)], max_bytes=200_000)
    assert too_big == [huge] and [n for _, n in chunks] == [1]


def test_bad_server_url_fails_early_with_the_expected_form(hello: Any) -> None:
    with pytest.raises(
        ValueError, match=r"expected a server URL such as 'ws://127.0.0.1:8765', got 'ftp://x'"
    ):
        WebSocketSink("ftp://x", hello, start=False)


def test_send_after_close_is_dropped_with_a_warning(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    sink = WebSocketSink(ack_server.url, hello, spool=tmp_path / "run.jsonl")
    sink.close(timeout=5)
    with pytest.warns(GradwatchWarning, match="after close"):
        sink.send(steps(0, 1))
    started = time.monotonic()
    sink.close(timeout=5)  # idempotent
    assert time.monotonic() - started < 5


def test_the_upload_command_of_a_sender_with_a_token_asks_for_it_without_saying_it(
    dead_port: int, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    secret = "s3cret-ingest-token-0123456789"
    with pytest.warns(GradwatchWarning) as caught:
        sink = WebSocketSink(f"ws://127.0.0.1:{dead_port}", hello, spool=spool, token=secret)
        sink.send(steps(0, 1))
        sink.close(timeout=0.5)
    texts = [str(w.message) for w in caught]
    command = f"gradwatch upload {spool} --server {sink.url}"
    assert any(f"{command} --token <the ingest token>" in t for t in texts), texts
    assert not any(secret in t for t in texts), texts
