"""Spools that are damaged or left behind still reach a real server (issue 18, items 3
and 4): every intact batch goes, each bad line is named, a restarted trainer sends
the spool of the process before it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol.sender import WebSocketSink


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "upload", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


def stored_steps(server: Any, run_id: str) -> list[int]:
    url = f"{server.http}/api/runs/{run_id}/steps?fields=loss"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
            return list(json.loads(answer.read())["fields"]["loss"]["step"])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise


def hello(run_id: str) -> dict[str, Any]:
    return {"type": "hello", "protocol": 1, "run_id": run_id, "rank": 0, "run": "damaged",
            "session": str(uuid.uuid4())}


def batch(run_id: str, seq: int) -> bytes:
    records = [{"kind": "step", "step": 2 * seq + i, "loss": 1.0 + seq} for i in range(2)]
    message = {"type": "batch", "run_id": run_id, "rank": 0, "seq": seq, "records": records}
    return json.dumps(message).encode() + b"\n"


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "utf8-bom"])
def test_upload_sends_every_intact_batch_and_names_each_bad_line(
    gradwatch_server: Callable[..., Any], tmp_path: Path, bom: bool
) -> None:
    server = gradwatch_server()
    run_id = str(uuid.uuid4())
    lines = [json.dumps(hello(run_id)).encode() + b"\n"]
    lines += [batch(run_id, seq) for seq in range(16)]
    lines[5] = b'{"type": "batch", "run_id": ' + b"\n"  # line 6: not JSON
    lines[9] = lines[9].replace(b'"loss"', b'"lo\xff\xfess"')  # line 10: not UTF-8
    torn = batch(run_id, 16)[:40]  # line 18: the writer died mid-line
    spool = tmp_path / "run.jsonl"
    spool.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"".join(lines) + torn)
    intact = sorted(s for seq in range(16) if seq not in (4, 8) for s in (2 * seq, 2 * seq + 1))
    for _ in range(2):  # a second run of the same upload stores nothing twice
        done = cli(str(spool), "--server", server.url)
        assert done.returncode == 4, done.stderr
        assert "14 of 14 batches" in done.stdout
        assert f"{spool}:6: expected one JSON message per line" in done.stderr
        assert f"{spool}:10: expected UTF-8 text, got byte 0xff" in done.stderr
        assert f"{spool}:18: the last line is torn" in done.stderr
        assert stored_steps(server, run_id) == intact


def test_a_batch_of_another_run_has_its_own_exit_code(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    run_id, other = str(uuid.uuid4()), str(uuid.uuid4())
    spool = tmp_path / "mixed.jsonl"
    spool.write_bytes(json.dumps(hello(run_id)).encode() + b"\n" + batch(run_id, 0)
                      + batch(other, 1) + batch(run_id, 2))
    done = cli(str(spool), "--server", server.url)
    assert done.returncode == 5, (done.returncode, done.stderr)
    assert f"{spool}:3: a batch of run '{other}'" in done.stderr
    assert stored_steps(server, run_id) == [0, 1, 4, 5]
    assert stored_steps(server, other) == []


def test_a_restarted_trainer_sends_the_spool_the_process_before_it_left(
    gradwatch_server: Callable[..., Any], tmp_path: Path, dead_port: int
) -> None:
    run_id = str(uuid.uuid4())
    spool = tmp_path / "trainer.jsonl"
    hello_message = {"type": "hello", "protocol": 1, "run_id": run_id, "rank": 0}
    # The sender thread warns "cannot reach" whenever its first connect fails, which
    # may come before close(): catch both, then ask for the one close() gives.
    with pytest.warns(UserWarning) as caught:
        first = WebSocketSink(f"ws://127.0.0.1:{dead_port}", hello_message, spool=spool,
                              connect_timeout=0.2)
        for step in range(300):
            first.send([{"kind": "step", "step": step, "loss": 0.5}])
        first.close(timeout=0.5)
    said = [str(w.message) for w in caught]
    assert any("gradwatch upload" in text for text in said), said
    assert first.delivered is False and spool.stat().st_size > 0

    server = gradwatch_server()
    second = WebSocketSink(server.url, hello_message, spool=spool)
    try:
        assert second.leftovers == [spool] and second.spool_path != spool
        second.send([{"kind": "step", "step": 300, "loss": 0.25}])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            spool.exists() or len(stored_steps(server, run_id)) < 301
        ):
            time.sleep(0.05)  # polling a condition with a deadline
        assert stored_steps(server, run_id) == list(range(301))
        assert not spool.exists()
    finally:
        second.close(timeout=10)


def test_closing_while_an_earlier_spool_is_still_being_sent_says_so(
    ack_server: Any, tmp_path: Path, dead_port: int
) -> None:
    """A restarted trainer that ends before its predecessor's spool is acknowledged:
    close() waits what is left of its time for it, then names the spool and the
    command (the process may end before the background upload does)."""
    run_id = str(uuid.uuid4())
    spool = tmp_path / "trainer.jsonl"
    hello_message = {"type": "hello", "protocol": 1, "run_id": run_id, "rank": 0}
    with pytest.warns(UserWarning):  # the first process cannot reach its server
        first = WebSocketSink(f"ws://127.0.0.1:{dead_port}", hello_message, spool=spool,
                              connect_timeout=0.2)
        for step in range(120):
            first.send([{"kind": "step", "step": step, "loss": 0.5}])
        first.close(timeout=0.5)
    ack_server.acks_held.set()  # takes the batches, acknowledges none yet
    with pytest.warns(UserWarning) as caught:
        second = WebSocketSink(ack_server.url, hello_message, spool=spool)
        assert second.leftovers == [spool]
        second.close(timeout=0.5)
        said = [str(w.message) for w in caught]
        ack_server.release()  # now the upload finishes and removes the spool
        assert second._resender is not None
        second._resender.join(30)
    assert any("still being sent" in t and f"gradwatch upload {spool} --server" in t
               for t in said), said
    assert not second._resender.is_alive() and not spool.exists()
    assert sorted({r["step"] for r in ack_server.records()}) == list(range(120))
