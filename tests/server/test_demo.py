"""`gradwatch demo`: a real server, real example trainers, real signals (no SIGINT, which a
background job such as `nohup make test &` ignores), nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runs(port: int, archived: bool = False) -> list[dict[str, Any]]:
    query = "?archived=true" if archived else ""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs{query}", timeout=2) as a:
            return list(json.loads(a.read()))
    except (OSError, urllib.error.URLError):
        return []


def processes_with(marker: str) -> list[int]:
    """Pids whose command line names `marker` (the test's own folder): what it started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_for(what: Callable[[], Any], timeout: float, process: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        got = what()
        if got:
            return got
        time.sleep(0.2)  # polling another process's state through its API or /proc
    raise AssertionError(f"not within {timeout} s: {what}")


def user_run(db: Path, name: str) -> str:
    """A run of the user's own in the demo's database (written before the demo starts)."""
    from gradwatch.server.schema import parse_message
    from gradwatch.server.settings import Settings
    from gradwatch.server.store import open_store

    run_id = "mine-0001"
    store = open_store(Settings(db=str(db)))
    try:
        hello = {"type": "hello", "protocol": 1, "run_id": run_id, "run": name}
        store.submit_hello(parse_message(json.dumps(hello))).result()
        step = {"kind": "step", "step": 0, "epoch": 0, "t": time.time(), "loss": 1.5,
                "duration_s": 0.01}
        batch = {"type": "batch", "run_id": run_id, "rank": 0, "seq": 0, "records": [step]}
        assert store.submit_batch(parse_message(json.dumps(batch)), "").result()
    finally:
        store.close()
    return run_id


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts `gradwatch demo` (db under tmp_path); at teardown, even after a failure,
    kills whatever is still running with tmp_path in its command line."""
    started: list[subprocess.Popen[bytes]] = []

    def start(port: int, *extra: str, ctrl_c: bool = False) -> subprocess.Popen[bytes]:
        command = ["-m", "gradwatch.server.cli"]
        if ctrl_c:  # as in a terminal, even when this test runs as a background job
            command = ["-c", "import runpy, signal, sys; sys.argv[0] = 'gradwatch';"
                       " signal.signal(signal.SIGINT, signal.default_int_handler);"
                       " runpy.run_module('gradwatch.server.cli', run_name='__main__')"]
        process = subprocess.Popen(
            [sys.executable, *command, "demo", "--port", str(port),
             "--db", str(tmp_path / "demo.db"), *extra],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
    for pid in processes_with(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def gone(marker: str) -> bool:
    return not processes_with(marker)


@pytest.mark.timeout(500)
@pytest.mark.slow
def test_the_demo_goes_round_until_sigterm_stops_it_all_and_a_restart_does_not_pile_up_runs(
    demo: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    # a user's own run in the same database, named like an example: never archived
    mine = user_run(tmp_path / "demo.db", "long_lstm")
    first = demo(port, "--only", "long_lstm", "--steps", "8")

    def demo_runs(archived: bool = False) -> list[dict[str, Any]]:
        return [r for r in runs(port, archived=archived) if r["id"] != mine]

    def rounds_finished() -> int:
        done = [r for r in demo_runs(archived=True) if r["status"] == "finished"]
        return len(done) // 2

    wait_for(lambda: rounds_finished() >= 2, 200, first)  # round two: still live
    # every round's runs are kept, but the list shows one run per example: a round
    # archives the one before it as it starts
    assert len(demo_runs(archived=True)) >= 4
    # (between two rounds a name may be missing for a moment, never listed twice)
    for _ in range(3):
        named = [r["name"] for r in demo_runs()]
        assert set(named) <= {"long_lstm", "long_lstm-fixed"}, named
        assert len(named) == len(set(named)), named
    assert mine in {r["id"] for r in runs(port)}  # listed, not archived
    assert len(processes_with(str(tmp_path))) >= 2  # the demo and its server at least
    first_ids = {r["id"] for r in demo_runs(archived=True)}
    first.send_signal(signal.SIGTERM)
    output, _ = first.communicate(timeout=60)
    text = output.decode()
    assert first.returncode == 0, text
    assert f"http://127.0.0.1:{port}" in text and "SIGTERM: stopping trainers and server" in text
    assert demo_runs() == []
    assert gone(str(tmp_path))  # the demo waited for every child before exiting

    again = demo(port, "--only", "long_lstm", "--steps", "8")

    def new_finished() -> int:
        return len([r for r in demo_runs(archived=True)
                    if r["id"] not in first_ids and r["status"] == "finished"])

    wait_for(lambda: new_finished() >= 2, 200, again)  # a round of this demo's own
    # One database for every start: the first demo's runs are all kept, archived by
    # this demo's first round, so the list shows one run per example.
    listed = demo_runs()
    named = [r["name"] for r in listed]
    assert set(named) <= {"long_lstm", "long_lstm-fixed"} and len(named) == len(set(named))
    assert first_ids <= {r["id"] for r in demo_runs(archived=True)}
    assert not first_ids & {r["id"] for r in listed}
    assert all(r["id"].startswith("demo-") for r in demo_runs(archived=True))
    # two demos and three rounds later, the user's run is listed as it was
    assert mine in {r["id"] for r in runs(port)}
    again.send_signal(signal.SIGTERM)
    again.communicate(timeout=60)
    assert again.returncode == 0


@pytest.mark.timeout(240)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "said"), [(signal.SIGHUP, "SIGHUP"), (signal.SIGINT, "Ctrl-C")], ids=["hup", "int"]
)
def test_sighup_or_ctrl_c_stops_the_server_and_the_trainers_at_once(
    demo: Callable[..., subprocess.Popen[bytes]], tmp_path: Path, sig: int, said: str
) -> None:
    port = free_port()
    process = demo(port, "--only", "long_lstm", "--steps", "400", ctrl_c=sig == signal.SIGINT)
    wait_for(lambda: any(r["status"] == "live" for r in runs(port)), 120, process)
    trainers = processes_with(str(ROOT / "examples" / "long_lstm.py"))
    assert trainers, "no trainer process was found"
    process.send_signal(sig)
    process.send_signal(sig)  # a second one while stopping cuts nothing short
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()
    assert f"{said}: stopping trainers and server" in output.decode()
    assert "Traceback" not in output.decode()
    assert gone(str(tmp_path))
    assert not [p for p in trainers if Path(f"/proc/{p}").exists()]
    assert runs(port) == []


def test_a_port_in_use_is_one_line_naming_port_before_anything_serves(
    demo: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = demo(port)
        output, _ = process.communicate(timeout=60)
    lines = output.decode().strip().splitlines()
    assert process.returncode == 2
    assert len(lines) == 1, lines
    assert f"port {port}" in lines[0] and "--port" in lines[0] and "in use" in lines[0]
    assert "serving" not in lines[0] and "dashboard" not in lines[0]
    assert gone(str(tmp_path))
