"""``gradwatch demo``: the dashboard with live example runs, on an embedded SQLite database.

Starts ``gradwatch serve`` as a child process, waits until it answers, launches the
example scenarios (each bug variant and its fixed twin) as separate trainer
processes streaming into it, prints the URL and what to look at, and on Ctrl-C stops
the trainers and then the server. ``--replay`` serves the runs already recorded in the
demo database without training.

Example:
    $ gradwatch demo              # or: make demo
    $ gradwatch demo --replay     # what the last demo recorded, no training
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

#: (script, demo steps, what the bug variant shows); every scenario also runs --fixed.
#: The steps keep each pair to about a minute on a 2-core CPU: the bug variants slow
#: down as they go (that is what they show), and stop at their --max-seconds anyway.
SCENARIOS: tuple[tuple[str, int, str], ...] = (
    ("long_lstm", 200, "vanishing: the first ~100 of 121 timesteps get no gradient"),
    ("rotation_lstm", 60, "graph_growth: a hidden state never detached, graph and step time grow"),
    ("tree_gru", 80, "graph_growth and slowdown: state kept on tree objects across epochs"),
    ("seq2seq_attention", 60, "hotspot: a decoder called once per target token dominates"),
)


@dataclass
class DemoPlan:
    url: str
    ws_url: str
    db: Path
    examples: Path | None
    trainers: list[list[str]]


def find_examples() -> Path | None:
    """The examples/ folder of a source checkout, if this is one."""
    for candidate in (Path.cwd() / "examples", Path(__file__).resolve().parents[1] / "examples"):
        if (candidate / "long_lstm.py").is_file():
            return candidate
    return None


def plan(args: argparse.Namespace) -> DemoPlan:
    url = f"http://127.0.0.1:{args.port}"
    ws_url = f"ws://127.0.0.1:{args.port}"
    examples = find_examples()
    trainers: list[list[str]] = []
    if examples is not None and not args.replay:
        for script, steps, _ in SCENARIOS:
            path = examples / f"{script}.py"
            if not path.is_file() or (args.only and script not in args.only):
                continue
            for fixed in (False, True):
                name = f"{script}{'-fixed' if fixed else ''}"
                command = [sys.executable, str(path), "--server", ws_url, "--run", name]
                command += ["--steps", str(args.steps or steps), "--quiet"]
                if fixed:
                    command.append("--fixed")
                trainers.append(command)
    return DemoPlan(url, ws_url, Path(args.db), examples, trainers)


def wait_until_serving(url: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll /api/health until the server answers; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before serving")
        try:
            # url is built here from 127.0.0.1 and a port: always http
            with urllib.request.urlopen(f"{url}/api/health", timeout=1) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)  # polling a child process's readiness; nothing to wait on instead
    raise RuntimeError(f"the server did not answer {url}/api/health within {timeout:.0f} s")


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # A session of its own: Ctrl-C reaches the demo alone, which then stops the
    # trainers and the server in order, instead of every child dying mid-import.
    return subprocess.Popen(command, env=env, start_new_session=True)


def run_demo(args: argparse.Namespace) -> int:
    demo = plan(args)
    demo.db.parent.mkdir(parents=True, exist_ok=True)
    if demo.examples is None and not args.replay:
        print(
            "gradwatch demo: the examples/ folder was not found (run from a source checkout, "
            "or use --replay to serve what a demo recorded). Serving the dashboard only.",
            file=sys.stderr,
        )
    server = start(
        [sys.executable, "-m", "gradwatch.server.cli", "serve", "--host", "127.0.0.1",
         "--port", str(args.port), "--db", str(demo.db), "--log-level", "warning"],
    )
    # Pairs (a bug and its twin) run side by side, one scenario after the other: eight
    # torch processes at once would spend the first minute importing on a small box.
    pending = [demo.trainers[i : i + 2] for i in range(0, len(demo.trainers), 2)]
    running: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    try:
        wait_until_serving(demo.url, server, timeout=60)
        print()
        print(f"  gradwatch dashboard: {demo.url}")
        print(f"  database:            {demo.db}")
        if demo.trainers:
            print("  Streaming the examples, each bug beside its fixed twin:")
            for script, _, shows in SCENARIOS:
                print(f"    - {script}: {shows}")
            print("  Open a bug run, then compare it with its -fixed twin.")
        else:
            print("  Showing the runs recorded in the database (no training).")
        print("  Ctrl-C stops everything.")
        print(flush=True)
        while True:
            running = [p for p in running if p.poll() is None]
            if not running and pending:
                running = [start(command, env) for command in pending.pop(0)]
                continue
            try:
                code = server.wait(timeout=1.0)  # the tick of this supervisor
            except subprocess.TimeoutExpired:
                continue
            print(f"gradwatch demo: the server exited with code {code}", file=sys.stderr)
            return code or 1
    except KeyboardInterrupt:
        print("\ngradwatch demo: stopping trainers and server...", flush=True)
        return 0
    except RuntimeError as e:
        print(f"gradwatch demo: {e}", file=sys.stderr)
        return 1
    finally:
        for trainer in running:
            stop(trainer)
        stop(server, signal.SIGINT)
