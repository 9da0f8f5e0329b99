"""Live latency: from the moment a training step closes to a `/ws/live` viewer.

N trainer processes (default 4) stream one run as ranks 0..N-1 at a steady step rate
to a real `gradwatch serve` process on 127.0.0.1; M viewers (default 20) watch that
run on `/ws/live`. Each step record carries `t` (time.time() when the step closed);
a viewer takes `time.time() - t` when the record arrives. Same machine, same clock.

Two ways of producing the records, side by side in one run:

- `monitor`: the real thing: `watch(model, server=...)` around a small LSTM training
  loop, `monitor.step(loss)` closes each step. Includes the Monitor's hand-over to its
  background thread (at most every `flush_interval` = 20 ms), encoding, the
  WebSocketSink, the server's commit, and the fan-out to every viewer.
- `sink`: a WebSocketSink fed one step record per step directly: the transport half
  alone (sink -> ingest -> commit -> ack / fan-out). The sink has no flush timer: a
  batch leaves as soon as its connection thread is free; records that arrive while
  it is busy are merged into the next batch.

`sink` records have the shape of bench/ingest.py (2 recurrent modules x 128 timesteps,
20 parameter norms); the `monitor` LSTM(1, 16) sees sequences of `--timesteps` (32):
watched training itself must leave CPU over on this 2-core box, or the bench measures
a saturated CPU instead of the path. The first second is warm-up and not counted.
The load average is printed: the box is shared, and p99 follows it.

    .venv/bin/python bench/latency.py                       # 4 trainers, 20 viewers, 50 steps/s
    .venv/bin/python bench/latency.py --rate 200 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from serve import Server  # bench/serve.py, beside this file

_T = re.compile(r'"t":(-?[0-9][0-9.eE+-]*)')


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# -- trainer processes -----------------------------------------------------------------


def step_record(step: int, rng: random.Random) -> dict[str, Any]:
    return {
        "kind": "step", "step": step, "epoch": 0, "t": time.time(), "duration_s": 0.02,
        "loss": rng.random(),
        "timesteps": {
            "lstm1": {"input": [rng.random() * 10.0 ** -(k % 30) for k in range(128)]},
            "lstm2": {"input": [rng.random() for _ in range(128)]},
        },
        "param_norms": {f"lstm{1 + j % 2}.weight_{j}": rng.random() for j in range(20)},
        "total_norm": rng.random(), "graph_nodes": 1000, "rss_bytes": 10_000_000,
        "overhead": 0.01,
    }


def paced(rate: float, seconds: float) -> Any:
    """Yields step indices at a steady rate (a bench's pacing, not synchronisation).

    First says "ready" and waits for "go" on stdin, so that every trainer has imported
    torch and connected before any is measured.
    """
    print("ready", flush=True)
    sys.stdin.readline()
    period = 1.0 / rate
    start = time.perf_counter()
    for step in range(int(rate * seconds)):
        delay = start + step * period - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield step


def trainer_sink(
    url: str, run_id: str, rank: int, world: int, rate: float, seconds: float, timesteps: int
) -> None:
    from gradwatch.protocol.sender import WebSocketSink

    hello = {"type": "hello", "protocol": 1, "run_id": run_id, "run": "latency-sink",
             "rank": rank, "world_size": world, "host": socket.gethostname(), "pid": os.getpid(),
             "model": {"modules": [], "parameters": 0, "recurrent": ["lstm1", "lstm2"]},
             "config": {}}
    spool = Path(tempfile.mkdtemp()) / "spool.jsonl"
    sink = WebSocketSink(url, hello, spool=spool)
    rng = random.Random(rank)
    last = 0
    for step in paced(rate, seconds):
        sink.send([step_record(step, rng)])
        last = step
    sink.send([{"kind": "end", "status": "finished", "step": last, "t": time.time()}])
    sink.close(timeout=30)


def trainer_monitor(
    url: str, run_id: str, rank: int, world: int, rate: float, seconds: float, timesteps: int
) -> None:
    import torch
    from torch import nn

    from gradwatch.trainer_hooks import watch

    torch.set_num_threads(1)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    torch.manual_seed(rank)
    model = nn.LSTM(1, 16, batch_first=True)
    head = nn.Linear(16, 1)
    params = [*model.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    spool = Path(tempfile.mkdtemp()) / "spool.jsonl"
    monitor = watch(model, run="latency-monitor", server=url, spool=spool, run_id=run_id,
                    diagnose=False)
    x, y = torch.randn(2, timesteps, 1), torch.randn(2, 1)
    for _ in paced(rate, seconds):
        out, _ = model(x)
        loss = nn.functional.mse_loss(head(out[:, -1]), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        monitor.step(loss)
    monitor.close(timeout=30)


# -- the measuring side ------------------------------------------------------------------


async def viewer(http_port: int, run_id: str, ready: asyncio.Event, counts: list[int],
                 latencies: list[float], ends: dict[int, int], warmup: list[float],
                 done: asyncio.Event, ranks: int) -> None:
    from websockets.asyncio.client import connect

    lagged = 0
    async with connect(f"ws://127.0.0.1:{http_port}/ws/live?run={run_id}", compression=None,
                       max_size=None, proxy=None) as ws:
        first = json.loads(await ws.recv())
        assert first.get("type") == "subscribed", first
        counts[0] += 1
        if counts[0] == counts[1]:
            ready.set()
        seen_ends = 0
        async for raw in ws:
            now = time.time()
            # A regex instead of json.loads: the viewers share the 2 CPUs with everything
            # else, and their own parsing would queue up in front of later arrivals.
            text = raw if isinstance(raw, str) else raw.decode()
            if text.startswith('{"type":"lagged"'):
                lagged += int(json.loads(text).get("dropped", 0))
                continue
            times = [float(t) for t in _T.findall(text)]
            ends_here = text.count('"kind":"end"')
            if ends_here:  # a rank's end record closes its last batch; it is no step
                seen_ends += ends_here
                times = times[:-ends_here]
            counts[2] += len(times)
            latencies.extend(now - t for t in times if t >= warmup[0])
            if seen_ends >= ranks:
                break
    ends[id(ws)] = lagged
    done.set()


async def measure(server_pid: int, port: int, mode: str, trainers: int, viewers: int, rate: float,
                  seconds: float, timesteps: int) -> dict[str, Any]:
    run_id = str(uuid.uuid4())
    ready = asyncio.Event()
    done = asyncio.Event()
    counts = [0, viewers, 0]  # viewers subscribed, viewers, step records received
    warmup = [float("inf")]  # set at "go"
    latencies: list[float] = []
    lagged: dict[int, int] = {}
    tasks = [asyncio.create_task(viewer(port, run_id, ready, counts, latencies, lagged, warmup,
                                        done, trainers)) for _ in range(viewers)]
    await asyncio.wait_for(ready.wait(), 60)
    children_before = own_cpu(resource.RUSAGE_CHILDREN)
    procs = [
        subprocess.Popen([sys.executable, __file__, "--_trainer", mode, "--_url",
                          f"ws://127.0.0.1:{port}", "--_run-id", run_id, "--_rank", str(r),
                          "--trainers", str(trainers), "--rate", str(rate),
                          "--seconds", str(seconds), "--timesteps", str(timesteps)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for r in range(trainers)
    ]
    for p in procs:  # wait until each has set up (imports, model, connection)
        assert p.stdout is not None
        line = await asyncio.to_thread(p.stdout.readline)
        assert line.strip() == "ready", line
    warmup[0] = time.time() + 1.0  # the first second after "go" is warm-up
    cpu_before = (proc_cpu(server_pid), own_cpu(resource.RUSAGE_SELF))
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    deadline = time.monotonic() + seconds + 120
    await asyncio.wait_for(asyncio.gather(*tasks), max(1.0, deadline - time.monotonic()))
    for p in procs:
        p.wait(timeout=60)
    cpu = (proc_cpu(server_pid) - cpu_before[0], own_cpu(resource.RUSAGE_SELF) - cpu_before[1],
           own_cpu(resource.RUSAGE_CHILDREN) - children_before)
    expected = trainers * viewers * int(rate * seconds)
    return {
        "mode": mode, "samples": len(latencies), "received": counts[2], "expected": expected,
        "p50": percentile(latencies, 50) * 1000, "p99": percentile(latencies, 99) * 1000,
        "max": max(latencies) * 1000, "mean": statistics.fmean(latencies) * 1000,
        "lagged": sum(lagged.values()),
        "cpu_server": cpu[0], "cpu_viewers": cpu[1], "cpu_trainers": cpu[2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--rate", type=float, default=50.0, help="steps/s per trainer")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", default="sink,monitor")
    parser.add_argument("--timesteps", type=int, default=32,
                        help="sequence length of the monitor mode's LSTM (default 32)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; medians are printed")
    parser.add_argument("--db", default=None, help="SQLite path or postgresql:// URL")
    parser.add_argument("--_trainer", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_run-id", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._trainer:
        run = trainer_sink if args._trainer == "sink" else trainer_monitor
        run(args._url, args._run_id, args._rank, args.trainers, args.rate, args.seconds,
            args.timesteps)
        return
    db = args.db or str(Path(tempfile.mkdtemp()) / "latency.db")
    server = Server(db)
    try:
        kind = "postgresql" if db.startswith("postgres") else "sqlite"
        print(f"{args.trainers} trainers x {args.rate:g} steps/s for {args.seconds:g} s, "
              f"{args.viewers} viewers on one run, db={kind}, "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'mode':<8} {'samples':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
              f"{'lagged':>6}   CPU s: {'server':>6} {'viewers':>7} {'trainers':>8} (+start)")
        results: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):  # modes interleaved, so both see the same load
            for mode in args.modes.split(","):
                r = asyncio.run(measure(server.process.pid, server.port, mode, args.trainers,
                                        args.viewers, args.rate, args.seconds, args.timesteps))
                results.setdefault(mode, []).append(r)
                print(f"{r['mode']:<8} {r['samples']:>8} {r['p50']:>7.1f} {r['p99']:>7.1f} "
                      f"{r['max']:>7.1f} {r['lagged']:>6}          {r['cpu_server']:>6.1f} "
                      f"{r['cpu_viewers']:>7.1f} {r['cpu_trainers']:>8.1f}"
                      + ("" if r["received"] == r["expected"] else
                         f"  (MISSING: {r['received']} of {r['expected']} records arrived)"),
                      flush=True)
        if args.repeat > 1:
            for mode, rounds in results.items():
                p50 = statistics.median(r["p50"] for r in rounds)
                p99 = statistics.median(r["p99"] for r in rounds)
                print(f"median of {args.repeat}: {mode:<8} p50 {p50:.1f} ms  p99 {p99:.1f} ms")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
