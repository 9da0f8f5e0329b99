"""SQLite's writer runs in a child process (server/store/writer_process.py): an
answer still means "committed", a writer that dies fails only what it held and is
replaced, closing finishes every queued write, and a server killed with -9 leaves no
writer behind. Processes are found the way an operator would: in /proc."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import StoreError, open_store

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def writers_of(parent: int) -> list[int]:
    """Pids of the writer processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == parent and b"gradwatch.server.store.sqlite" in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not yet reaped by its parent


def wait_until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        time.sleep(0.02)  # polling a condition with a deadline, not a fixed sleep


def _batch(run: str, seq: int, steps: range) -> Any:
    records = [{"kind": "step", "step": s, "loss": 1.0 / (s + 1)} for s in steps]
    return parse_message(
        json.dumps({"type": "batch", "run_id": run, "rank": 0, "seq": seq, "records": records})
    )


def _open(path: Path, run: str) -> Any:
    store = open_store(Settings(db=str(path)))
    hello = {"type": "hello", "protocol": 1, "run_id": run}
    store.submit_hello(parse_message(json.dumps(hello))).result(timeout=30)
    return store


def test_writes_are_committed_by_a_child_that_ends_with_the_store(tmp_path):
    store = _open(tmp_path / "g.db", "r")
    try:
        (writer,) = writers_of(os.getpid())
        assert store.submit_batch(_batch("r", 0, range(10))).result(timeout=30) is True
        assert store.submit_batch(_batch("r", 0, range(10))).result(timeout=30) is False
        # Answered means committed: a fresh connection of this process reads it.
        assert store.steps("r", fields=["loss"])["total"] == 10
    finally:
        store.close()
    assert gone(writer)
    assert writers_of(os.getpid()) == []


def test_closing_finishes_every_queued_write(tmp_path):
    store = _open(tmp_path / "g.db", "r")
    futures = [
        store.submit_batch(_batch("r", seq, range(seq * 50, seq * 50 + 50))) for seq in range(40)
    ]
    store.close()
    assert all(f.result(timeout=1) for f in futures)
    again = open_store(Settings(db=str(tmp_path / "g.db")))
    try:
        assert again.steps("r", fields=["loss"])["total"] == 2000
    finally:
        again.close()


def test_a_dead_writer_fails_what_it_held_and_a_new_one_takes_over(tmp_path):
    store = _open(tmp_path / "g.db", "r")
    try:
        assert store.submit_batch(_batch("r", 0, range(10))).result(timeout=30)
        (writer,) = writers_of(os.getpid())
        os.kill(writer, signal.SIGKILL)
        wait_until(lambda: writers_of(os.getpid()) not in ([], [writer]))
        # A write after the death goes to the new writer (or, if sent to the dead one
        # in between, fails: the trainer resends it, as after any store error).
        try:
            stored = store.submit_batch(_batch("r", 1, range(10, 20))).result(timeout=30)
        except StoreError:
            stored = store.submit_batch(_batch("r", 1, range(10, 20))).result(timeout=30)
        assert stored is True
        assert store.steps("r", fields=["loss"])["total"] == 20
    finally:
        store.close()


def test_a_server_killed_with_9_leaves_no_writer_behind(gradwatch_server):
    server = gradwatch_server()
    assert server.process is not None
    (writer,) = writers_of(server.process.pid)
    server.kill()
    wait_until(lambda: gone(writer))


def test_the_writer_can_stay_in_the_server_process(tmp_path):
    store = open_store(Settings(db=str(tmp_path / "g.db"), writer_process=False))
    try:
        store.submit_hello(
            parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": "r"}))
        ).result(timeout=30)
        assert writers_of(os.getpid()) == []
        assert store.submit_batch(_batch("r", 0, range(5))).result(timeout=30)
    finally:
        store.close()


def test_serve_writer_thread_keeps_writes_in_the_server_process(gradwatch_server, wire):
    server = gradwatch_server(args=("--writer", "thread"))
    assert server.process is not None
    assert writers_of(server.process.pid) == []
    run_id = wire.run_id()
    assert wire.send_run(server, run_id, [[wire.step(0), wire.step(1)]]) == [
        {"type": "ack", "seq": 0, "live": False}
    ]
    assert wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss")["total"] == 2


def test_writes_in_flight_when_the_writer_dies_all_get_an_answer(tmp_path):
    """None hangs: each is stored (True: every batch here is new) or fails (StoreError,
    so the trainer resends); a resend of every failed one then stores each step exactly
    once, and the replaced writer still knows every batch (a third send is a duplicate)."""
    store = _open(tmp_path / "g.db", "r")
    try:
        (writer,) = writers_of(os.getpid())
        batches = [_batch("r", seq, range(seq * 20, seq * 20 + 20)) for seq in range(60)]
        futures = [store.submit_batch(b) for b in batches]
        os.kill(writer, signal.SIGKILL)
        failed = []
        for batch, future in zip(batches, futures, strict=True):
            try:
                # Each batch is sent once here, so an answer can only say "new".
                assert future.result(timeout=60) is True
            except StoreError:
                failed.append(batch)
        for batch in failed:
            # True, or False where the dead writer had committed it but not answered.
            assert isinstance(store.submit_batch(batch).result(timeout=60), bool)
        assert [store.submit_batch(b).result(timeout=60) for b in batches] == [False] * 60
        steps = store.steps("r", fields=["loss"], max_points=10_000)
        assert steps["total"] == 1200
        assert steps["fields"]["loss"]["step"] == list(range(1200))
    finally:
        store.close()
