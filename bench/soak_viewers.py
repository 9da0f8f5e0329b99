"""Soak: server memory and ingest rate with viewers that never read attached.

A real `gradwatch serve` on 127.0.0.1 (SQLite); one trainer streams one run at a
fixed batch rate, each batch one step record with a packed series of `--series`
float64 values (~85 KB of base64 by default), pipelined with acks awaited, as
WebSocketSink does; `--slow` viewers watch the run on raw sockets with a 4 KB receive
buffer that never read after the handshake. When the server drops one (it fell
behind by more than `--queue-bytes`), a new one takes its place, so `--slow` are
attached all the time. Every `--sample` seconds the server's RSS (and its writer
process's) is read from /proc, and the acknowledged batch rate of that interval.

Verdict: the RSS of the last sample within 20 % of the first one after warm-up
(`--warmup` seconds), and the ingest rate of each interval within 10 % of the
target. The box is shared: rates are noisy.

    .venv/bin/python bench/soak_viewers.py --seconds 600
    .venv/bin/python bench/soak_viewers.py --seconds 120 --rate 20 --slow 5
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import tempfile
import threading
import time
import uuid

from serve import Server  # bench/serve.py, beside this file
from websockets.sync.client import connect


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its children (the SQLite writer), KiB."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def slow_viewer(port: int, run_id: str) -> socket.socket | None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    try:
        sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /ws/live?run={run_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                raise OSError("closed in the handshake")
            head += chunk
    except OSError:
        sock.close()
        return None
    return sock


def dropped(sock: socket.socket) -> bool:
    """Whether the server ended this connection (peeks, reads nothing)."""
    # TCP_INFO's first byte is the state: 1 is ESTABLISHED; a reset or closed one is not.
    if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != 1:
        return True
    try:
        sock.setblocking(False)
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


class Trainer(threading.Thread):
    def __init__(self, port: int, run_id: str, rate: float, series: int) -> None:
        super().__init__(daemon=True)
        self.url = f"ws://127.0.0.1:{port}/ws/ingest"
        self.run_id = run_id
        self.rate = rate
        values = struct.pack(f"<{series}d", *(float(i % 97) for i in range(series)))
        self.packed = base64.b64encode(values).decode()
        self.acked = 0
        self.stop = threading.Event()

    def run(self) -> None:
        hello = {"type": "hello", "protocol": 1, "run_id": self.run_id, "rank": 0,
                 "run": "soak", "session": str(uuid.uuid4())}
        with connect(self.url, max_size=None, ping_interval=None) as ws:
            ws.send(json.dumps(hello))
            start = time.monotonic()
            seq = 0
            while not self.stop.is_set():
                due = start + seq / self.rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the offered rate, not synchronisation
                record = {"kind": "step", "step": seq, "loss": 1.0,
                          "timesteps": {"lstm1": {"input": {"f64": self.packed}}}}
                ws.send(json.dumps({"type": "batch", "run_id": self.run_id, "rank": 0,
                                    "seq": seq, "records": [record]}))
                seq += 1
                while True:  # drain acks without blocking the pace
                    try:
                        message = json.loads(ws.recv(timeout=0 if seq - self.acked < 64 else 5))
                    except TimeoutError:
                        break
                    if message.get("type") == "ack":
                        self.acked += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=20.0, help="batches per second")
    parser.add_argument("--series", type=int, default=8000)
    parser.add_argument("--slow", type=int, default=5)
    parser.add_argument("--queue-bytes", type=int, default=16 << 20)
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="gradwatch-soak-")
    server = Server(
        os.path.join(folder, "soak.db"),
        env={"GRADWATCH_LIVE_QUEUE_BYTES": str(args.queue_bytes)},
        quiet=True,
    )
    port, proc = server.port, server.process
    run_id = str(uuid.uuid4())
    trainer = Trainer(port, run_id, args.rate, args.series)
    viewers: list[socket.socket] = []
    replaced = 0
    samples: list[tuple[float, int, float]] = []
    try:
        trainer.start()
        time.sleep(1.0)  # the run exists before the viewers subscribe
        start = time.monotonic()
        last_t, last_acked = start, trainer.acked
        next_sample = start + args.sample
        while time.monotonic() - start < args.seconds:
            for sock in [v for v in viewers if dropped(v)]:
                viewers.remove(sock)
                sock.close()
                replaced += 1
            while len(viewers) < args.slow:
                sock = slow_viewer(port, run_id)
                if sock is None:
                    break
                viewers.append(sock)
            now = time.monotonic()
            if now >= next_sample:
                rate = (trainer.acked - last_acked) / (now - last_t)
                samples.append((now - start, rss_kib(proc.pid), rate))
                print(f"{now - start:7.0f} s  rss {samples[-1][1] / 1024:7.1f} MiB  "
                      f"ingest {rate:6.1f} batches/s  viewers {len(viewers)} "
                      f"(replaced {replaced})", flush=True)
                last_t, last_acked = now, trainer.acked
                next_sample += args.sample
            time.sleep(0.2)  # the viewers' check interval
    finally:
        trainer.stop.set()
        trainer.join(10)
        for sock in viewers:
            sock.close()
        server.stop()
    steady = [s for s in samples if s[0] >= args.warmup]
    if len(steady) < 2:
        print("too short for a verdict")
        return
    first, last = steady[0][1], steady[-1][1]
    peak = max(s[1] for s in steady)
    rates = [s[2] for s in steady]
    low = min(rates)
    print(f"\nrss after warm-up {first / 1024:.1f} MiB, last {last / 1024:.1f} MiB "
          f"({100 * (last - first) / first:+.1f} %), peak {peak / 1024:.1f} MiB")
    print(f"ingest {sum(rates) / len(rates):.1f} batches/s mean, {low:.1f} lowest "
          f"(target {args.rate}); slow viewers dropped and replaced: {replaced}")
    flat = abs(last - first) <= 0.2 * first
    held = low >= 0.9 * args.rate
    print(f"memory flat within 20 %: {'yes' if flat else 'NO'}; "
          f"ingest held within 10 %: {'yes' if held else 'NO'}")


if __name__ == "__main__":
    main()
