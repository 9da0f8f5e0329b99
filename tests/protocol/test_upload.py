"""`gradwatch upload` against a real websocket server on 127.0.0.1 (tests/protocol/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from gradwatch.protocol.spool import SpoolWriter, read_spool
from gradwatch.protocol.upload import upload


def write_spool(path: Path, parts: list[tuple[dict[str, Any], list[list[dict[str, Any]]]]]) -> None:
    with SpoolWriter(path) as w:
        for hello, batches in parts:
            w.write(hello)
            for seq, records in enumerate(batches):
                w.write(
                    {
                        "type": "batch",
                        "run_id": hello["run_id"],
                        "rank": hello["rank"],
                        "seq": seq,
                        "records": records,
                    }
                )


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "upload", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_upload_sends_every_part_with_its_original_seqs(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    rank1 = {**hello, "rank": 1}
    spool = tmp_path / "run.jsonl"
    write_spool(
        spool,
        [(hello, [steps(i, 3) for i in range(0, 30, 3)]), (rank1, [steps(i, 1) for i in range(5)])],
    )
    result = upload(spool, ack_server.url, window=4)
    assert (result.parts, result.batches, result.acked, result.records) == (2, 15, 15, 35)
    with ack_server.cond:
        stored = dict(ack_server.stored)
    run = hello["run_id"]
    assert sorted(k for k in stored if k[1] == 0) == [(run, 0, s) for s in range(10)]
    assert sorted(k for k in stored if k[1] == 1) == [(run, 1, s) for s in range(5)]
    assert [r["step"] for s in range(10) for r in stored[(run, 0, s)]] == list(range(30))
    assert [h["rank"] for h in ack_server.hellos] == [0, 1]


def test_upload_twice_stores_once(ack_server: Any, hello: Any, steps: Any, tmp_path: Path) -> None:
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(i, 1) for i in range(20)])])
    first = upload(spool, ack_server.url)
    second = upload(spool, ack_server.url)
    assert first.acked == second.acked == 20  # repeats are acknowledged too
    assert len(ack_server.received) == 40
    assert [r["step"] for r in ack_server.records()] == list(range(20))


def test_spool_of_a_trainer_killed_mid_run_uploads_completely(
    dead_port: int, ack_server: Any, tmp_path: Path
) -> None:
    """kill -9 of the training process: every batch handed to the sink is on disk."""
    spool = tmp_path / "run.jsonl"
    script = textwrap.dedent(f"""
        import os, signal, warnings
        from gradwatch.protocol.sender import WebSocketSink
        warnings.simplefilter("ignore")
        hello = {{"type": "hello", "protocol": 1, "run_id": "killed-run", "rank": 0}}
        sink = WebSocketSink("ws://127.0.0.1:{dead_port}", hello, spool={str(spool)!r})
        for s in range(200):
            sink.send([{{"kind": "step", "step": s, "epoch": 0, "t": 0.0}}])
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    process = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert process.returncode == -signal.SIGKILL
    result = upload(spool, ack_server.url)
    assert result.acked == 200
    assert [r["step"] for r in ack_server.records()] == list(range(200))


def test_cli_upload_reports_success(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(0, 2), steps(2, 2)])])
    done = cli(str(spool), "--server", ack_server.url)
    assert done.returncode == 0, done.stderr
    assert "2 of 2 batches (4 records, 1 part(s)) acknowledged" in done.stdout
    assert len(ack_server.records()) == 4


def test_cli_upload_sets_refused_batches_aside_and_exits_1(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.reject_seqs = {1}
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(i, 1) for i in range(4)])])
    done = cli(str(spool), "--server", ack_server.url)
    assert done.returncode == 1
    assert "batch seq 1 refused (code 1007): records[0].step: bad seq 1" in done.stderr
    assert [m["seq"] for m in read_spool(tmp_path / "run.rejected.jsonl")] == [1]
    assert ack_server.seqs() == [0, 2, 3]


def test_cli_upload_missing_file_exits_2(tmp_path: Path) -> None:
    done = cli(str(tmp_path / "nope.jsonl"))
    assert done.returncode == 2
    assert "nope.jsonl" in done.stderr and "No such file" in done.stderr


def test_cli_upload_batch_without_hello_exits_2(tmp_path: Path) -> None:
    spool = tmp_path / "bad.jsonl"
    spool.write_text('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0, "records": []}\n')
    done = cli(str(spool))
    assert done.returncode == 2
    assert "expected a hello before the first batch" in done.stderr


def test_cli_upload_unreachable_server_exits_3_and_keeps_the_file(
    dead_port: int, hello: Any, steps: Any, tmp_path: Path
) -> None:
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(0, 1)])])
    before = spool.read_bytes()
    done = cli(str(spool), "--server", f"ws://127.0.0.1:{dead_port}", "--timeout", "1")
    assert done.returncode == 3
    assert "cannot reach the server" in done.stderr and "run the upload again" in done.stderr
    assert spool.read_bytes() == before


def test_cli_upload_wrong_token_exits_3(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.token = "right"
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(0, 1)])])
    done = cli(str(spool), "--server", ack_server.url, "--token", "wrong")
    assert done.returncode == 3
    assert "refused the upload (code 1008: expected a token)" in done.stderr
    assert os.path.exists(spool)


def test_cli_upload_refused_hello_sets_no_batch_aside(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.hello_error = "run: expected at most 256 characters, got 300"
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(0, 1), steps(1, 1)])])
    done = cli(str(spool), "--server", ack_server.url)
    assert done.returncode == 3
    assert "refused the upload (code 1007: run: expected at most 256" in done.stderr
    assert not (tmp_path / "run.rejected.jsonl").exists()


def test_upload_sets_aside_the_batch_an_error_names(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    ack_server.name_seq_in_errors = True
    ack_server.reject_seqs = {0}
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(i, 1) for i in range(3)])])
    result = upload(spool, ack_server.url)
    assert [(seq, code) for seq, code, _ in result.rejected] == [(0, 1007)]
    assert ack_server.seqs() == [1, 2]


def test_upload_blames_the_oldest_batch_in_flight_once_one_was_acknowledged(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    # An error that names neither a seq nor a field, after an ack on the same
    # connection: the hello was accepted, so the oldest unacknowledged batch is refused.
    ack_server.batch_error = "the store refused this data"
    ack_server.reject_seqs = {1}
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(i, 1) for i in range(4)])])
    result = upload(spool, ack_server.url)
    assert [(seq, code) for seq, code, _ in result.rejected] == [(1, 1007)]
    assert ack_server.seqs() == [0, 2, 3]


def test_upload_blames_the_first_batch_of_a_new_connection_once_the_hello_was_accepted(
    ack_server: Any, hello: Any, steps: Any, tmp_path: Path
) -> None:
    # Batch 0 acknowledged, then the connection dies as batch 1 arrives; on the next one,
    # batch 1 comes first and is refused by an error naming nothing. The same hello was
    # accepted before, so the error is batch 1's: it is set aside, the rest go.
    ack_server.batch_error = "the store refused this data"
    ack_server.reject_seqs = {1}
    ack_server.drop_at_seq = 1
    spool = tmp_path / "run.jsonl"
    write_spool(spool, [(hello, [steps(i, 1) for i in range(4)])])
    result = upload(spool, ack_server.url, window=1)  # ack 0 is read before 1 goes
    assert [(seq, code) for seq, code, _ in result.rejected] == [(1, 1007)]
    assert ack_server.seqs() == [0, 2, 3]
    assert ack_server.received[:3] == [0, 1, 1]  # 1 dropped, then 1 refused
    assert len(ack_server.hellos) >= 2
