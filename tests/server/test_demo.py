"""`gradwatch demo`: a real server, real example trainers streaming, a clean Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runs(port: int) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=2) as a:
            return list(json.loads(a.read()))
    except (OSError, urllib.error.URLError):
        return []


@pytest.mark.slow
def test_demo_streams_a_bug_and_its_twin_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "gradwatch.server.cli", "demo", "--port", str(port),
         "--db", str(tmp_path / "demo.db"), "--only", "long_lstm", "--steps", "12"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 100
        finished: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline and len(finished) < 2:
            assert demo.poll() is None, demo.stdout.read().decode() if demo.stdout else ""
            finished = {r["name"]: r for r in runs(port) if r["status"] == "finished"}
            time.sleep(0.2)  # polling another process's database through its API
        assert set(finished) == {"long_lstm", "long_lstm-fixed"}, runs(port)
        assert finished["long_lstm"]["last_step"] == 11
        assert finished["long_lstm"]["alerts"] >= 1  # the vanishing gradient, named
        assert finished["long_lstm-fixed"]["alerts"] == 0
    finally:
        demo.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
        output, _ = demo.communicate(timeout=60)
    text = output.decode()
    assert demo.returncode == 0, text
    assert f"http://127.0.0.1:{port}" in text and "stopping trainers and server" in text
    assert runs(port) == []  # the server is gone too
