"""``gradwatch demo``: the dashboard with live example runs, on an embedded SQLite database.

Starts ``gradwatch serve`` as a child process, waits until it answers, launches the
example scenarios (each bug variant and its fixed twin) as separate trainer
processes streaming into it, prints the URL and what to look at, and goes round the
examples again until it is stopped. Ctrl-C, SIGTERM and SIGHUP (a closed terminal)
all stop the trainers, then the server, then anything left in their process group;
the children also get SIGTERM should the demo itself die (Linux). The demo writes
the one default database of every command (``$GRADWATCH_DB``, else ``gradwatch.db``
in the user's data folder: :func:`~gradwatch.server.settings.default_db`), so
``gradwatch report`` finds its runs; each round, the first one of a restart
included, archives the listed runs of the examples it is about to train (readable
by id, listed with ``?archived=true``), so neither a round nor a restart piles up
another set of runs. Only runs a demo started are archived: their ids begin with
``demo-`` (``$GRADWATCH_RUN_ID``, set for each trainer), so a user's own run that
happens to share an example's name is left alone, as is every other run. ``--replay``
serves what the database holds without training.

Example:
    $ gradwatch demo              # or: make demo
    $ gradwatch demo --replay     # what the last demo recorded, no training
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

#: (script, demo steps, what the bug variant shows); every scenario also runs --fixed.
#: The steps keep each pair to about a minute on a 2-core CPU: the bug variants slow
#: down as they go (that is what they show), and stop at their --max-seconds anyway.
SCENARIOS: tuple[tuple[str, int, str], ...] = (
    ("long_lstm", 200, "vanishing: the first ~100 of 121 timesteps get no gradient"),
    ("rotation_lstm", 60, "graph_growth: a hidden state never detached, graph and step time grow"),
    ("tree_gru", 80, "graph_growth and slowdown: state kept on tree objects across epochs"),
    ("seq2seq_attention", 60, "hotspot: a decoder called once per target token dominates"),
    ("tiny_gpt", 120, "spike: a batch of unmasked padding at step 80 spikes the loss"),
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
    from .settings import default_db

    return DemoPlan(url, ws_url, Path(args.db or default_db()), examples, trainers)


def run_name(command: list[str]) -> str:
    """The ``--run`` name a trainer command streams under."""
    return command[command.index("--run") + 1]


#: the run ids of the demo's trainers begin with this (and only theirs are archived)
DEMO_RUN_ID_PREFIX = "demo-"


def demo_run_id() -> str:
    """A fresh run id for one demo trainer: the prefix, then a UUID4."""
    return f"{DEMO_RUN_ID_PREFIX}{uuid.uuid4()}"


def archive_earlier(url: str, names: set[str]) -> int:
    """Archive the listed runs a demo started (ids beginning with ``demo-``) called one
    of ``names``: a round about to start replaces them, so the runs list keeps one run
    per example instead of one per round (they stay readable by id, and listed with
    ``?archived=true``). Best effort: returns how many were archived; a server that
    does not answer costs nothing but this."""
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("GRADWATCH_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    archived = 0
    try:
        request = urllib.request.Request(f"{url}/api/runs", headers=headers)  # noqa: S310 - http://127.0.0.1
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            listed = json.loads(answer.read())
        for run in listed:
            if run.get("name") not in names or not str(run.get("id", "")).startswith(
                DEMO_RUN_ID_PREFIX
            ):
                continue  # not one of the demo's own runs: never touched
            body = json.dumps({"archived": True}).encode()
            put = urllib.request.Request(  # noqa: S310 - http://127.0.0.1, the demo's own server
                f"{url}/api/runs/{run['id']}/archived", data=body, headers=headers, method="PUT"
            )
            with urllib.request.urlopen(put, timeout=5):  # noqa: S310
                archived += 1
    except (OSError, ValueError, KeyError, TypeError):
        pass  # the demo goes on; at worst the list shows another round
    return archived


def wait_until_serving(
    url: str, server: subprocess.Popen[bytes], timeout: float,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Poll /api/health until the server answers or ``stopping()``; fail if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
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
    if stopping():
        return
    raise RuntimeError(f"the server did not answer {url}/api/health within {timeout:.0f} s")


class StopSignals:
    """The signals that stop the demo, recorded by a handler that never raises.

    The supervisor acts on them at its next tick. Raising from the handler (as Ctrl-C's
    KeyboardInterrupt does) can land inside ``Popen.wait`` or ``Popen.poll`` after they
    took the child's waitpid lock and before the ``try`` that releases it; stopping the
    server then blocks forever on that lock (a SIGHUP hung the demo so in CI).
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            current = signal.getsignal(sig)
            if sig == signal.SIGINT and current is not signal.default_int_handler:
                continue  # ignored (a background job) or the user's own: left as it is
            self._previous[sig] = signal.signal(sig, self._record)
        # a signal while stopping is recorded too and cuts nothing short

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)

    def asked(self) -> bool:
        return bool(self.received)

    def describe(self) -> str:
        first = self.received[0]
        return "Ctrl-C" if first == signal.SIGINT else signal.Signals(first).name


def port_problem(port: int) -> str | None:
    """Why the demo cannot serve on 127.0.0.1:``port``, or None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as uvicorn binds: a previous demo's connections in TIME_WAIT do not count
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on 127.0.0.1 is in use (another gradwatch demo or server?);"
                    " stop it, or choose another port with --port PORT"
                )
            return f"cannot listen on 127.0.0.1:{port} ({e.strerror}); choose another with --port"
    return None


def _child_setup(group: int) -> None:
    """In each child before exec: join process group ``group`` (0: a new one), default
    Ctrl-C (a background job inherits it ignored) and, on Linux, SIGTERM when the demo
    dies, so nothing outlives it."""
    with contextlib.suppress(OSError):
        os.setpgid(0, group)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start(
    command: list[str], env: dict[str, str] | None = None, group: int | None = None,
    quiet: bool = False,
) -> subprocess.Popen[bytes]:
    """A child in the demo's process group ``group`` (the server's; a new one for the
    server itself): Ctrl-C reaches the demo alone, which then stops the trainers and
    the server in order, and one ``killpg`` ends whatever they left behind."""
    return subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if quiet else None,
        # the demo has no threads: preexec_fn is safe here
        preexec_fn=functools.partial(_child_setup, group or 0),
    )


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_demo(args: argparse.Namespace) -> int:
    demo = plan(args)
    problem = port_problem(args.port)
    if problem is not None:
        print(f"gradwatch demo: {problem}", file=sys.stderr)
        return 2
    demo.db.parent.mkdir(parents=True, exist_ok=True)
    if demo.examples is None and not args.replay:
        print(
            "gradwatch demo: the examples/ folder was not found (run from a source checkout, "
            "or use --replay to serve what a demo recorded). Serving the dashboard only.",
            file=sys.stderr,
        )
    stops = StopSignals()
    stops.install()
    server: subprocess.Popen[bytes] | None = None
    running: list[subprocess.Popen[bytes]] = []
    try:
        server = start(
            [sys.executable, "-m", "gradwatch.server.cli", "serve", "--host", "127.0.0.1",
             "--port", str(args.port), "--db", str(demo.db), "--log-level", "warning"],
            quiet=True,  # the demo prints where to look itself; errors still show
        )
        code = _supervise(demo, server, running, stops)
        if stops.asked():
            lead = "\n" if stops.received[0] == signal.SIGINT else ""  # after the ^C echo
            print(f"{lead}gradwatch demo: {stops.describe()}: stopping trainers and server...",
                  flush=True)
            return 0
        return code
    except RuntimeError as e:
        print(f"gradwatch demo: {e}", file=sys.stderr)
        return 1
    finally:
        for trainer in running:
            stop(trainer)
        if server is not None:
            stop(server)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)  # anything left in the group
        stops.restore()


def _supervise(
    demo: DemoPlan, server: subprocess.Popen[bytes], running: list[subprocess.Popen[bytes]],
    stops: StopSignals,
) -> int:
    """Start the trainers pair by pair until a stop signal arrives (0) or the server
    exits (its code); stopping them is the caller's."""
    wait_until_serving(demo.url, server, timeout=60, stopping=stops.asked)
    if stops.asked():
        return 0
    print()
    print(f"  gradwatch dashboard: {demo.url}")
    print(f"  database:            {demo.db}")
    if demo.trainers:
        print("  Streaming the examples, each bug beside its fixed twin, round after round:")
        for script, _, shows in SCENARIOS:
            print(f"    - {script}: {shows}")
        print("  Open a bug run, then compare it with its -fixed twin.")
    else:
        print("  Showing the runs recorded in the database (no training).")
    print("  Ctrl-C (or kill, or closing the terminal) stops everything.")
    from .hints import tunnel_hint

    print(tunnel_hint(int(demo.url.rsplit(":", 1)[1])))
    print(flush=True)
    # Pairs (a bug and its twin) run side by side, one scenario after the other: ten
    # torch processes at once would spend the first minute importing on a small box.
    pairs = [demo.trainers[i : i + 2] for i in range(0, len(demo.trainers), 2)]
    pending = list(pairs)
    # the trainers' own "streaming run ... to" lines would repeat the dashboard's link
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GRADWATCH_QUIET="1")
    while not stops.asked():
        running[:] = [p for p in running if p.poll() is None]
        if not running and pairs:
            if not pending:
                pending = list(pairs)  # round again: the demo stays live until stopped
            pair = pending.pop(0)
            archive_earlier(demo.url, {run_name(command) for command in pair})
            running[:] = [
                start(command, dict(env, GRADWATCH_RUN_ID=demo_run_id()), group=server.pid)
                for command in pair
            ]
            continue
        try:
            code = server.wait(timeout=0.25)  # the tick: how soon a signal is acted on
        except subprocess.TimeoutExpired:
            continue
        print(f"gradwatch demo: the server exited with code {code}", file=sys.stderr)
        return code or 1
    return 0
