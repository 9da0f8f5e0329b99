"""``/api/health`` tells a frozen writer (issue 18, item 9): the writer alive but not
committing, with writes waiting, answers 503 with the reason; once it moves again,
200. Frozen for real: the writer process stopped with SIGSTOP, or the database's
write lock held by another real SQLite connection. Never a mock."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

STALL_S = 1.0  # the bound the servers here run with (GRADWATCH_WRITER_STALL_S)


def _health(wire: Any, server: Any) -> tuple[int, dict[str, Any]]:
    status, body, _ = wire.get(server, "/api/health")
    return status, body


def _until_health(wire: Any, server: Any, status: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll /api/health until it answers ``status`` (a readiness poll, bounded)."""
    deadline = time.monotonic() + timeout_s
    seen: list[tuple[int, Any]] = []
    while time.monotonic() < deadline:
        got, body = _health(wire, server)
        if got == status:
            return body
        seen.append((got, body))
        time.sleep(0.1)
    raise AssertionError(f"expected /api/health {status} within {timeout_s} s, got {seen[-3:]}")


def _writer_pid(server: Any) -> int:
    """The server's writer child (``python -m gradwatch.server.store.sqlite``, started by
    store/writer_process.py), from /proc."""
    assert server.process is not None
    root = server.process.pid
    for task in Path(f"/proc/{root}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"gradwatch.server.store.sqlite" in cmdline:
                return int(child)
    raise AssertionError("expected a writer process under the server, found none")


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)  # never leave a stopped process behind


@contextlib.contextmanager
def _write_locked(db: str) -> Iterator[None]:
    conn = sqlite3.connect(db, timeout=5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")  # the one write lock of a WAL database
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


@pytest.mark.parametrize("freeze", ["sigstop-writer-process", "lock-held-elsewhere",
                                    "lock-held-elsewhere-writer-thread"])
def test_health_answers_503_while_the_writer_is_frozen_and_200_after(
    gradwatch_server: Callable[..., Any], wire: Any, freeze: str
) -> None:
    args = ("--writer", "thread") if freeze.endswith("thread") else ()
    server = gradwatch_server(env={"GRADWATCH_WRITER_STALL_S": str(STALL_S)}, args=args)
    run_id = wire.run_id()
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(run_id)))
        ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(0)])))
        assert wire.recv(ws) == {"type": "ack", "seq": 0, "live": False}
        status, body = _health(wire, server)
        assert status == 200 and body["status"] == "ok" and body["pending_writes"] == 0, body
        frozen = (_stopped(_writer_pid(server)) if freeze.startswith("sigstop")
                  else _write_locked(server.db))
        with frozen:
            ws.send(json.dumps(wire.batch(run_id, 1, [wire.step(1)])))
            body = _until_health(wire, server, 503)
            assert body["status"] == "unavailable", body
            assert body["reason"].startswith("the database writer has 1 write(s) waiting"), body
            assert body["pending_writes"] == 1
            # REST reads still answer: only the writer is stuck
            steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")
            assert steps["fields"]["loss"]["step"] == [0]
        assert wire.recv(ws) == {"type": "ack", "seq": 1, "live": False}  # the write went through
    body = _until_health(wire, server, 200)
    assert body["status"] == "ok" and body["pending_writes"] == 0
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")
    assert steps["fields"]["loss"]["step"] == [0, 1]
