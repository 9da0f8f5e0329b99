"""The server fixture other tests build on: start, ingest, kill -9, restart."""

from __future__ import annotations

import json
import urllib.request

from websockets.sync.client import connect


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310
        return json.loads(answer.read())


def test_acknowledged_batches_survive_kill_9_and_restart(gradwatch_server, gradwatch_db):
    server = gradwatch_server(db=gradwatch_db)
    hello = {
        "type": "hello",
        "protocol": 1,
        "run_id": "run-kill",
        "run": "kill",
        "rank": 0,
        "world_size": 1,
        "host": "h",
        "pid": 1,
        "model": {},
        "config": {},
    }
    with connect(server.url + "/ws/ingest") as ws:
        ws.send(json.dumps(hello))
        for seq in range(3):
            ws.send(
                json.dumps(
                    {
                        "type": "batch",
                        "run_id": "run-kill",
                        "rank": 0,
                        "seq": seq,
                        "records": [{"kind": "step", "step": seq}],
                    }
                )
            )
        acks = [json.loads(ws.recv(timeout=30)) for _ in range(3)]
    assert acks == [{"type": "ack", "seq": s, "live": False} for s in range(3)]
    server.kill()
    assert not server.running
    server.restart()
    steps = _get(server.http + "/api/runs/run-kill/steps?fields=loss,duration_s")
    runs = _get(server.http + "/api/runs")
    assert [r["last_step"] for r in runs] == [2]
    assert steps["total"] == 3
