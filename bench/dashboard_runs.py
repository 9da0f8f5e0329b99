"""The runs bench/dashboard.py shows: step records, ingested in bulk over /ws/ingest or
streamed live by real trainer sinks.

Heavy records carry a 121-timestep heatmap row and 20 parameter norms; what a watched
2-layer LSTM sends (``realistic_step``) adds a second series and 16 gate norms.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from serve import Server  # bench/serve.py, beside this file
from websockets.sync.client import connect

PARAMS = [f"layer{i}.weight" for i in range(20)]


def step_record(step: int, heavy: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "step", "step": step, "epoch": step // 1000, "t": time.time(),
        "duration_s": 0.01 + 0.001 * random.random(), "loss": 1 / (1 + step), "overhead": 0.02,
        "total_norm": 1 + math.sin(step / 500), "graph_nodes": 120, "rss_bytes": 300_000_000,
    }  # fmt: skip
    if heavy:
        rec["timesteps"] = {"lstm": {"input": [0.5 * 0.8 ** (120 - t) for t in range(121)]}}
        rec["param_norms"] = {p: random.random() for p in PARAMS}
    return rec


def hello(run_id: str, name: str) -> str:
    return json.dumps({
        "type": "hello", "protocol": 1, "run_id": run_id, "run": name, "rank": 0,
        "world_size": 1, "host": "bench", "pid": 1,
        "model": {"modules": [{"name": "lstm", "type": "LSTM"}], "recurrent": ["lstm"]},
        "config": {},
    })  # fmt: skip


def ingest(server: Server, name: str, steps: int, heavy_every: int) -> str:
    """Send `steps` step records in batches of 5,000, 8 in flight, every batch acknowledged."""
    run_id = str(uuid.uuid4())
    # No keepalive pings: a busy server may take longer than a ping timeout to answer.
    with connect(server.url + "/ws/ingest", max_size=None, ping_interval=None) as ws:
        ws.send(hello(run_id, name))
        starts = list(range(0, steps, 5000))
        in_flight = 0
        for seq, start in enumerate(starts):
            stop = min(steps, start + 5000)
            records = [step_record(s, s % heavy_every == 0) for s in range(start, stop)]
            batch = {"type": "batch", "run_id": run_id, "rank": 0, "seq": seq, "records": records}
            ws.send(json.dumps(batch))
            in_flight += 1
            if in_flight == 8:
                assert json.loads(ws.recv(timeout=300))["type"] == "ack"
                in_flight -= 1
        for _ in range(in_flight):
            assert json.loads(ws.recv(timeout=300))["type"] == "ack"
    return run_id


GATES = {f"lstm.weight_{w}_l{i}": "ifgo" for w in ("ih", "hh") for i in (0, 1)}


def realistic_step(step: int) -> dict[str, Any]:
    """What a watched 2-layer LSTM sends on a heavy step: two 121-step series, 20
    parameter norms, 16 gate norms, the scalars."""
    rec = step_record(step, True)
    rec["timesteps"]["lstm"]["layer1"] = [0.4 * 0.85 ** (120 - t) for t in range(121)]
    rec["gate_norms"] = {p: {g: random.random() for g in gates} for p, gates in GATES.items()}
    return rec


class Streams:
    """`runs` real sinks, each sending one step record every 1/rate s until stopped."""

    def __init__(self, server: Server, runs: int, rate: float) -> None:
        from gradwatch.protocol.sender import WebSocketSink

        self.ids = [str(uuid.uuid4()) for _ in range(runs)]
        self.sinks = [
            WebSocketSink(server.url, json.loads(hello(run_id, f"live-{i}")), announce=False,
                          spool=Path(tempfile.mkdtemp()) / "spool.jsonl")
            for i, run_id in enumerate(self.ids)
        ]  # fmt: skip
        for sink in self.sinks:
            sink.send([realistic_step(0)])
            sink.flush(timeout=30)
        self.rate = rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        step, next_at = 1, time.monotonic()
        while not self.stop.is_set():
            for sink in self.sinks:
                sink.send([realistic_step(step)])
            step += 1
            next_at += 1 / self.rate
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for sink in self.sinks:
            sink.close(timeout=10)
