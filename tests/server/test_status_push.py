"""Every change of a run's status reaches its viewers (`/ws/live?run=` and the runs
list) as a `run` message, the changes time alone makes too: a trainer that went away
is `stalled`, then `stale` once it wrote nothing for GRADWATCH_STALE_AFTER_S, as
GET /api/runs/{id} says; a stale run whose trainer comes back is `live` again. With
several replicas each tells its own viewers what its own API says. Real servers,
real websockets; the thresholds are set small."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

# Stale 3 s after the last write without a trainer connected.
QUICK = {"GRADWATCH_STALE_AFTER_S": "3"}
# And stalled 1 s after the last step before that, as a killed trainer's run is.
STALLS = {**QUICK, "GRADWATCH_STALLED_MIN_S": "1", "GRADWATCH_STALLED_FACTOR": "1"}


def _statuses_until(
    wire: Any, viewer: Any, run_id: str, want: str, timeout_s: float = 30.0
) -> list[str]:
    """The statuses the viewer is told of ``run_id``, up to the first ``want``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not seen or seen[-1] != want:
        try:
            message = wire.recv(viewer, timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"expected {want!r} for the run, was told {seen}") from None
        if message["type"] == "run" and message["run"]["id"] == run_id:
            seen.append(message["run"]["status"])
    return seen


def _api_says(wire: Any, server: Any, run_id: str, want: str, timeout_s: float = 30.0) -> None:
    """Wait until GET /api/runs/{id} says ``want`` (a bounded poll of the API)."""
    deadline = time.monotonic() + timeout_s
    while wire.get_ok(server, f"/api/runs/{run_id}")["status"] != want:
        assert time.monotonic() < deadline, f"expected the API to say {want!r}"
        time.sleep(0.1)  # between two polls of the condition


def _train(wire: Any, server: Any, run_id: str, first_seq: int = 0, live: bool = False) -> None:
    """A trainer connects, stores a few steps and goes away; ``live``: the run has a
    viewer, which its acks say."""
    with wire.connect(server) as trainer:
        trainer.send(json.dumps(wire.hello(run_id)))
        steps = [wire.step(first_seq * 5 + s) for s in range(5)]
        trainer.send(json.dumps(wire.batch(run_id, first_seq, steps)))
        assert wire.recv(trainer) == {"type": "ack", "seq": first_seq, "live": live}


@contextlib.contextmanager
def _subscribe(wire: Any, server: Any, run_id: str | None) -> Iterator[Any]:
    """A viewer of the run (None: of the runs list), subscribed."""
    with wire.connect(server, "/ws/live" + (f"?run={run_id}" if run_id else "")) as viewer:
        assert wire.recv(viewer) == {"type": "subscribed", "run_id": run_id}
        yield viewer


def test_a_run_whose_trainer_went_away_is_pushed_stale_to_its_viewers(
    gradwatch_server: Any, gradwatch_db: str, wire: Any
) -> None:
    server = gradwatch_server(db=gradwatch_db, env=STALLS)
    run_id = wire.run_id()
    with _subscribe(wire, server, run_id) as view, _subscribe(wire, server, None) as runs:
        _train(wire, server, run_id, live=True)
        # Told stalled (unless its 2 s fall between two ticks), then stale: on both.
        _statuses_until(wire, view, run_id, "stale")
        _statuses_until(wire, runs, run_id, "stale")
        assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "stale"


def test_a_stale_run_whose_trainer_comes_back_is_pushed_live_to_its_run_view(
    gradwatch_server: Any, wire: Any
) -> None:
    server = gradwatch_server(env=QUICK)
    run_id = wire.run_id()
    _train(wire, server, run_id)
    _api_says(wire, server, run_id, "stale")
    # A page opened on the stale run, then the trainer resumes.
    with _subscribe(wire, server, run_id) as view, wire.connect(server) as trainer:
        trainer.send(json.dumps(wire.hello(run_id)))
        trainer.send(json.dumps(wire.batch(run_id, 1, [wire.step(5)])))
        assert wire.recv(trainer) == {"type": "ack", "seq": 1, "live": True}
        _statuses_until(wire, view, run_id, "live")
        assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "live"


@pytest.mark.postgres
def test_a_viewer_on_another_replica_is_pushed_stale(
    gradwatch_server: Any, shared_schema: tuple[str, str], wire: Any
) -> None:
    db, _ = shared_schema
    a = gradwatch_server(db=db, env=QUICK)
    b = gradwatch_server(db=db, env=QUICK)
    run_id = wire.run_id()
    with _subscribe(wire, b, run_id) as view, _subscribe(wire, b, None) as runs:
        _train(wire, a, run_id, live=True)
        # B counts no trainer of its own and has no step times: never stalled there.
        assert _statuses_until(wire, view, run_id, "stale") == ["stale"]
        assert _statuses_until(wire, runs, run_id, "stale")[-1] == "stale"
        assert wire.get_ok(b, f"/api/runs/{run_id}")["status"] == "stale"
