"""`gradwatch serve --workers N`: several server processes on one port, sharing one
PostgreSQL database and its live feed; refused on SQLite, where live records could
not reach viewers on the other processes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def test_workers_on_sqlite_are_refused_with_what_is_needed(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "serve", "--port", "0",
         "--db", str(tmp_path / "g.db"), "--workers", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--workers 2 needs --db postgresql://" in done.stderr
    assert "Nothing was started" in done.stderr
    assert not (tmp_path / "g.db").exists()


@pytest.mark.postgres
def test_two_workers_store_every_batch_once_and_every_viewer_sees_every_rank(
    gradwatch_server, shared_schema, wire
) -> None:
    server = gradwatch_server(db=shared_schema[0], args=("--workers", "2"))
    assert server.process is not None
    assert len(_children(server.process.pid)) >= 2  # two worker processes serve the port
    run_id = wire.run_id()
    ranks, batches = 8, 3
    with contextlib.ExitStack() as stack:
        # Viewers first, on several connections (the kernel spreads them over the workers).
        viewers = [
            stack.enter_context(wire.connect(server, f"/ws/live?run={run_id}")) for _ in range(4)
        ]
        for viewer in viewers:
            assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        trainers = [stack.enter_context(wire.connect(server)) for _ in range(ranks)]
        for rank, ws in enumerate(trainers):
            ws.send(json.dumps(wire.hello(run_id, rank=rank, world_size=ranks)))
        for seq in range(batches):
            for rank, ws in enumerate(trainers):
                step = wire.step(seq, params=2)
                ws.send(json.dumps(wire.batch(run_id, seq, [step], rank=rank)))
        for ws in trainers:
            assert [wire.recv(ws)["seq"] for _ in range(batches)] == list(range(batches))
        want = {(rank, seq) for rank in range(ranks) for seq in range(batches)}
        for viewer in viewers:
            seen: set[tuple[int, int]] = set()
            deadline = time.monotonic() + 30
            while not want <= seen and time.monotonic() < deadline:
                message: dict[str, Any] = wire.recv(viewer, timeout=30)
                if message["type"] == "records" and message["run_id"] == run_id:
                    seen.add((message["rank"], message["seq"]))
            assert want <= seen, sorted(want - seen)
    for rank in range(ranks):
        steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?rank={rank}&fields=loss")
        assert steps["fields"]["loss"]["step"] == list(range(batches))  # each once
    assert wire.get_ok(server, f"/api/runs/{run_id}")["ranks"] == list(range(ranks))
    workers = _children(server.process.pid)
    server.stop()
    # A clean stop takes every child down (workers, multiprocessing's helper), none left
    # holding the port; they may take a moment after the parent has exited.
    deadline = time.monotonic() + 20
    while any(_alive(c) for c in workers) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval of the check, not synchronisation
    assert not [c for c in workers if _alive(c)]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status.lower()
