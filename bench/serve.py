"""A real `gradwatch serve` process on 127.0.0.1 for the benchmarks beside this file.

ingest.py, ingest_ab.py, dashboard.py, ranks.py, latency.py and soak_viewers.py
measure the server users run, so they start that process, not an app in their own:
its websockets, its store and its writer are all part of what they time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A real `gradwatch serve` subprocess on a free port, answering once constructed.

    ``env`` is added to this process's environment (``PYTHONPATH`` picks an older
    tree); ``quiet`` sends its output to /dev/null, so a browser benchmark's tables
    stay readable.
    """

    def __init__(
        self, db: str, env: dict[str, str] | None = None, workers: int = 1, quiet: bool = False
    ) -> None:
        self.port = free_port()
        self.http = f"http://127.0.0.1:{self.port}"
        self.url = f"ws://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "gradwatch.server.cli", "serve", "--port", str(self.port),
               "--db", db, "--log-level", "warning", "--workers", str(workers)]  # fmt: skip
        output = subprocess.DEVNULL if quiet else None
        self.process = subprocess.Popen(
            cmd, env={**os.environ, **(env or {})}, stdout=output, stderr=output
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(self.http + "/api/health", timeout=2):  # noqa: S310
                    return
            except OSError:
                time.sleep(0.05)  # readiness poll
        self.process.kill()  # no server left behind
        self.process.wait()
        raise SystemExit("gradwatch serve did not start")

    def get(self, path: str) -> tuple[float, Any]:
        start = time.perf_counter()
        with urllib.request.urlopen(self.http + path, timeout=600) as answer:  # noqa: S310
            body = answer.read()
        return time.perf_counter() - start, json.loads(body)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
