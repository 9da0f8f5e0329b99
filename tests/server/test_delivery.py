"""End to end delivery: watch() in a training loop -> WebSocketSink -> a real
`gradwatch serve` process (tests/conftest.py), checked over the REST API.

Every test checks the whole step sequence: each step stored exactly once, none missing,
whatever happened to the server in between (kill -9, down at the start, never up).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol.spool import read_spool
from gradwatch.protocol.warnings import GradwatchWarning
from gradwatch.trainer_hooks import watch

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core box: intra-op threads only contend (a step took
    330 ms with the default threads under load, 3 ms with one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_OPEN: list[Any] = []


@pytest.fixture(autouse=True)
def close_every_trainer() -> Iterator[None]:
    """A test that fails mid-run must not leave a sender thread warning into the
    tests after it: every Trainer is closed at teardown, pass or fail."""
    yield
    while _OPEN:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _OPEN.pop().monitor.close(timeout=0)


class TinyLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class Trainer:
    """A real training loop under watch(); `train(n)` runs n steps."""

    def __init__(self, server: str, run_id: str, spool: Path | None = None) -> None:
        torch.manual_seed(0)
        self.model = TinyLSTM()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.monitor = watch(self.model, run="delivery", server=server, spool=spool,
                             run_id=run_id, diagnose=False)
        self.steps = 0
        _OPEN.append(self)

    def train(self, n: int) -> None:
        for _ in range(n):
            x, y = torch.randn(4, 6, 3), torch.randn(4, 1)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.monitor.step(loss)
            self.steps += 1

    @property
    def sink(self) -> Any:
        return self.monitor._pipeline.sink

    def wait_disconnected(self, timeout: float) -> bool:
        """Wait on the sender's own condition until it has seen the connection end."""
        sink = self.sink
        with sink._cond:
            return bool(sink._cond.wait_for(lambda: not sink.connected, timeout=timeout))

    def delivered(self, timeout: float = 60.0) -> bool:
        """Every record so far handed to the sink and acknowledged by the server."""
        return bool(self.monitor.flush(timeout)) and bool(self.sink.flush(timeout))


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def get(server: Any, path: str) -> Any:
    with urllib.request.urlopen(server.http + path, timeout=30) as answer:  # noqa: S310
        return json.loads(answer.read())


def stored_steps(server: Any, run_id: str) -> list[int]:
    answer = get(server, f"/api/runs/{run_id}/steps?fields=loss&max_points=1000000")
    assert answer["downsampled"] is False
    steps: list[int] = answer["fields"]["loss"]["step"]
    assert answer["total"] == len(steps)
    return steps


def run_id_for(name: str) -> str:
    import uuid

    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gradwatch-test-{name}-{uuid.uuid4()}"))


def test_watched_training_run_end_to_end(gradwatch_server: Any, tmp_path: Path) -> None:
    server = gradwatch_server()
    run_id = run_id_for("e2e")
    trainer = Trainer(server.url, run_id, spool=tmp_path / "run.jsonl")
    trainer.train(40)
    trainer.monitor.epoch()
    trainer.train(10)
    assert trainer.monitor.close(timeout=60)
    assert stored_steps(server, run_id) == list(range(50))
    summary = get(server, f"/api/runs/{run_id}")
    assert summary["status"] == "finished" and summary["last_step"] == 49
    assert [e["epoch"] for e in get(server, f"/api/runs/{run_id}/epochs")] == [0]
    assert trainer.sink.stats()["pending_batches"] == 0
    assert not (tmp_path / "run.jsonl").exists()  # everything acknowledged: no spool left


def test_kill_9_mid_run_and_restart_stores_every_step_exactly_once(
    gradwatch_server: Any, gradwatch_db: str, tmp_path: Path
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id = run_id_for("kill9")
    with pytest.warns(GradwatchWarning) as caught:
        trainer = Trainer(server.url, run_id, spool=tmp_path / "run.jsonl")
        trainer.train(30)
        assert trainer.delivered()
        trainer.train(15)  # some of these are in flight when the server dies
        server.kill()
        # The sender learns of the death from its socket, on its own thread; from
        # then on, batches go to the spool rather than the in-flight window.
        assert trainer.wait_disconnected(60)
        trainer.train(40)  # training goes on while the server is gone
        assert trainer.monitor.flush(60)  # every record so far handed to the sink...
        assert trainer.sink.stats()["spooled_batches"] > 0  # ...which spools them
        server.restart()
        trainer.train(15)
        assert trainer.monitor.close(timeout=60)
    assert stored_steps(server, run_id) == list(range(100))
    assert get(server, f"/api/runs/{run_id}")["status"] == "finished"
    assert trainer.sink.stats()["connections"] >= 2
    assert any("lost the connection" in str(w.message) for w in caught)


def test_server_down_at_start_then_up_delivers_everything(
    gradwatch_server: Any, unused_port: int, tmp_path: Path
) -> None:
    run_id = run_id_for("down-at-start")
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning, match="cannot reach"):
        trainer = Trainer(f"ws://127.0.0.1:{unused_port}", run_id, spool=spool)
        trainer.train(50)  # nothing waits on the network: every step completes
        assert trainer.monitor.flush(30)
        assert trainer.sink.stats()["memory_batches"] == 0
        assert next(m["type"] for m in read_spool(spool)) == "hello"  # on disk meanwhile
        server = gradwatch_server(port=unused_port)
        trainer.train(20)
        assert trainer.monitor.close(timeout=60)
    assert stored_steps(server, run_id) == list(range(70))
    assert not spool.exists()


def test_server_never_up_then_gradwatch_upload_twice_stores_once(
    gradwatch_server: Any, unused_port: int, tmp_path: Path
) -> None:
    run_id = run_id_for("upload")
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning) as caught:
        trainer = Trainer(f"ws://127.0.0.1:{unused_port}", run_id, spool=spool)
        trainer.train(60)
        trainer.monitor.close(timeout=0.5)
    assert any("gradwatch upload" in str(w.message) and str(spool) in str(w.message)
               for w in caught)
    messages = list(read_spool(spool))
    assert messages[0]["type"] == "hello" and messages[0]["run_id"] == run_id
    assert [m["seq"] for m in messages[1:]] == list(range(len(messages) - 1))
    server = gradwatch_server()
    for _ in range(2):  # idempotent
        done = subprocess.run(
            [sys.executable, "-m", "gradwatch.server.cli", "upload", str(spool),
             "--server", server.url],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
    assert stored_steps(server, run_id) == list(range(60))
    assert get(server, f"/api/runs/{run_id}")["status"] == "finished"


def test_batch_the_real_server_refuses_is_set_aside_and_the_rest_stored(
    gradwatch_server: Any, tmp_path: Path
) -> None:
    from gradwatch.protocol.sender import WebSocketSink

    server = gradwatch_server()
    run_id = run_id_for("refused")
    hello = {"type": "hello", "protocol": 1, "run_id": run_id, "run": "refused", "rank": 0,
             "world_size": 1, "host": "test", "pid": 1,
             "model": {"modules": [], "parameters": 0, "recurrent": []}, "config": {}}
    spool = tmp_path / "run.jsonl"
    with pytest.warns(GradwatchWarning, match="refused batch seq 7"):
        # One batch per send (no merging), several in flight: the ones sent after the bad
        # batch are lost with its connection and must be resent on the next.
        sink = WebSocketSink(server.url, hello, spool=spool, max_batch_bytes=1)
        for s in range(20):
            sink.send([{"kind": "step", "step": "x" if s == 7 else s, "epoch": 0,
                        "t": float(s), "duration_s": 0.01, "loss": 1.0}])
        assert sink.flush(timeout=60)
        sink.close(timeout=10)
    assert stored_steps(server, run_id) == [s for s in range(20) if s != 7]
    (rejected,) = read_spool(tmp_path / "run.rejected.jsonl")
    assert rejected["seq"] == 7 and rejected["records"][0]["step"] == "x"


def test_offline_spool_of_watch_uploads_to_the_server(
    gradwatch_server: Any, tmp_path: Path
) -> None:
    """watch(server=None, spool=...) records offline; `gradwatch upload` sends it later."""
    run_id = run_id_for("offline")
    spool = tmp_path / "offline.jsonl"
    torch.manual_seed(0)
    model = TinyLSTM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = watch(model, run="offline", spool=spool, run_id=run_id, diagnose=False)
    for _ in range(25):
        loss = nn.functional.mse_loss(model(torch.randn(2, 5, 3)), torch.randn(2, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        monitor.step(loss)
    monitor.epoch()
    assert monitor.close(timeout=30)
    server = gradwatch_server()
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "upload", str(spool),
         "--server", server.url],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert stored_steps(server, run_id) == list(range(25))
    assert get(server, f"/api/runs/{run_id}")["status"] == "finished"
    assert [e["epoch"] for e in get(server, f"/api/runs/{run_id}/epochs")] == [0]


def test_two_ranks_under_load_through_kill_9_each_stored_exactly_once(
    gradwatch_server: Any, gradwatch_db: str, wire: Any, tmp_path: Path
) -> None:
    """Sinks driven directly, many batches in flight when the server dies: the ones it
    committed but never acknowledged come again and must not be stored twice."""
    from gradwatch.protocol.sender import WebSocketSink

    server = gradwatch_server(db=gradwatch_db)
    run_id = run_id_for("ranks")
    with pytest.warns(GradwatchWarning):
        sinks = [
            WebSocketSink(server.url, wire.hello(run_id, rank=rank, world_size=2),
                          spool=tmp_path / f"rank{rank}.jsonl", max_batch_bytes=64 * 1024)
            for rank in (0, 1)
        ]
        for chunk in range(3):  # connected and acknowledged first
            for sink in sinks:
                sink.send([wire.step(s) for s in range(chunk * 10, chunk * 10 + 10)])
        assert all(sink.flush(timeout=60) for sink in sinks)
        sent = 30
        for chunk in range(30):  # a burst: the kill lands while these are in flight
            for sink in sinks:
                sink.send([wire.step(s) for s in range(sent + chunk * 10, sent + chunk * 10 + 10)])
        server.kill()
        sent += 300
        for sink in sinks:  # more while the server is down
            sink.send([wire.step(s) for s in range(sent, sent + 50)])
        sent += 50
        server.restart()
        assert all(sink.flush(timeout=90) for sink in sinks)
        for sink in sinks:
            sink.close(timeout=10)
    for rank in (0, 1):
        answer = get(server, f"/api/runs/{run_id}/steps?rank={rank}&fields=loss&max_points=100000")
        assert answer["fields"]["loss"]["step"] == list(range(sent)), f"rank {rank}"
        assert answer["total"] == sent
    assert sum(sink.stats()["resent_batches"] for sink in sinks) > 0


def test_resumed_process_with_the_same_run_id_is_not_taken_for_repeats(
    gradwatch_server: Any, wire: Any, tmp_path: Path
) -> None:
    from gradwatch.protocol.sender import WebSocketSink

    server = gradwatch_server()
    run_id = run_id_for("resume")
    for part in range(2):  # two processes of one run, one after the other
        sink = WebSocketSink(server.url, wire.hello(run_id), spool=tmp_path / f"p{part}.jsonl")
        sink.send([wire.step(s) for s in range(part * 10, part * 10 + 10)])
        assert sink.flush(timeout=60)
        sink.close(timeout=10)
    assert stored_steps(server, run_id) == list(range(20))
