"""Shared test plumbing.

Parts that a developer's machine may lack (Chromium, PostgreSQL, a CUDA device) skip
with a loud reason there (`MISSING PART: ...`), and the end of every session counts
them in one summary section, so an absent part is never silent. Switches that turn a
missing part into a failure:

- GRADWATCH_REQUIRE_ALL=1 (CI): Chromium and PostgreSQL must be there.
- GRADWATCH_REQUIRE_CUDA=1 (a GPU box): the CUDA tests must run. CUDA has its own
  switch because CI has no GPU: there the CUDA tests skip, loudly and counted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from time import perf_counter as _perf_counter

import pytest

# Tiny models on a 2-core box: torch's default intra-op threads make a 3 ms step take
# hundreds of ms under load. Set before any test imports torch, and inherited by every
# trainer and server process the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REQUIRE_ALL = os.environ.get("GRADWATCH_REQUIRE_ALL") == "1"
REQUIRE_CUDA = os.environ.get("GRADWATCH_REQUIRE_CUDA") == "1"
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
POSTGRES_URL = os.environ.get("GRADWATCH_TEST_POSTGRES_URL")

# What each missing part cost in this session: part -> number of tests it skipped.
_MISSING: dict[str, int] = {}


def require_part(
    available: bool, what: str, required: bool = REQUIRE_ALL, switch: str = "GRADWATCH_REQUIRE_ALL"
) -> None:
    """Skip (developer machine) or fail (``required``, as CI sets) when a real part is
    missing; the session's summary counts every such skip."""
    if available:
        return
    message = f"MISSING PART: {what}"
    if required:
        pytest.fail(message + f" ({switch}=1, so this fails instead of skipping)")
    pytest.skip(message)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Counted from the reports, not in require_part: a session fixture that skips runs
    # once and pytest re-raises its skip for every later test that uses it.
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if reason.startswith("MISSING PART: "):
            what = reason.removeprefix("MISSING PART: ")
            _MISSING[what] = _MISSING.get(what, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One section at the end of the run naming each missing part and its skipped tests."""
    if not _MISSING:
        return
    terminalreporter.section("missing parts", sep="=", yellow=True, bold=True)
    for what, count in sorted(_MISSING.items()):
        terminalreporter.write_line(f"MISSING PART: {what}: {count} test(s) skipped")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="session")
def cuda_device() -> str:
    """The CUDA tests' part: skips (loudly, counted) without a GPU, fails instead where
    GRADWATCH_REQUIRE_CUDA=1. Use as ``pytestmark = pytest.mark.usefixtures("cuda_device")``."""
    require_part(
        _cuda_available(),
        "CUDA (a CUDA device and a CUDA build of torch; GRADWATCH_REQUIRE_CUDA=1 on a GPU box)",
        required=REQUIRE_CUDA,
        switch="GRADWATCH_REQUIRE_CUDA",
    )
    return "cuda"


def _spend(seconds: float) -> float:
    """Keep this thread's CPU busy for ``seconds``, as slow code (a callback's own work)
    would; the seconds spent, 0.0 for none."""
    if seconds <= 0:
        return 0.0
    started = _perf_counter()
    while _perf_counter() - started < seconds:
        pass
    return _perf_counter() - started


@pytest.fixture(scope="session")
def spend() -> Callable[[float], float]:
    """``spend(seconds)``: busy work of known length (not a wait: nothing to sync on)."""
    return _spend


@pytest.fixture(scope="session")
def chromium_path() -> str:
    require_part(
        shutil.which(CHROMIUM) is not None or os.path.exists(CHROMIUM),
        f"Chromium at {CHROMIUM} (apt-get install chromium, or set GRADWATCH_CHROMIUM)",
    )
    return CHROMIUM


@pytest.fixture(scope="session")
def postgres_url() -> str:
    require_part(
        bool(POSTGRES_URL),
        "PostgreSQL (set GRADWATCH_TEST_POSTGRES_URL=postgresql://...; .ci/run starts one)",
    )
    assert POSTGRES_URL is not None
    return POSTGRES_URL


# ----- a real gradwatch server --------------------------------------------------------
# `gradwatch_server(...)` starts `python -m gradwatch.server.cli serve` as a subprocess
# on a free loopback port and waits for /api/health (a bounded poll: readiness, not a
# sleep). `.kill()` is kill -9; `.restart()` starts it again on the same port and db.

import json as _json  # noqa: E402
import signal as _signal  # noqa: E402
import socket as _socket  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import sys as _sys  # noqa: E402
import time as _time  # noqa: E402
import urllib.error as _urlerror  # noqa: E402
import urllib.request as _urlrequest  # noqa: E402
import uuid as _uuid  # noqa: E402
from collections.abc import Callable as _Callable  # noqa: E402
from collections.abc import Iterator as _Iterator  # noqa: E402
from pathlib import Path as _Path  # noqa: E402


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A real `gradwatch serve` process on 127.0.0.1.

    Attributes: `url` (ws://127.0.0.1:PORT, what trainers get), `http`
    (http://127.0.0.1:PORT), `port`, `db` (SQLite path or postgresql:// URL), `log_path`.
    """

    def __init__(
        self,
        db: str,
        log_path: _Path,
        port: int | None = None,
        token: str | None = None,
        view_token: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.db = db
        self.port = port or free_port()
        self.token = token
        self.view_token = view_token
        self.args = args
        self.env = env
        self.log_path = log_path
        self.url = f"ws://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.port}"
        self.process: _subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [_sys.executable, "-m", "gradwatch.server.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--db", self.db, "--log-level", "warning"]
        if self.token:
            cmd += ["--token", self.token]
        if self.view_token:
            cmd += ["--view-token", self.view_token]
        return cmd + list(self.args)

    def start(self, timeout: float = 60.0) -> ServerProcess:
        env = dict(os.environ)
        env.update(self.env or {})
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it while it runs
        try:
            self.process = _subprocess.Popen(self.command(), stdout=log, stderr=log, env=env)
        finally:
            log.close()
        self.wait_ready(timeout)
        return self

    def health(self) -> dict[str, object] | None:
        try:
            with _urlrequest.urlopen(self.http + "/api/health", timeout=2) as answer:  # noqa: S310
                return dict(_json.loads(answer.read()))
        except (OSError, _urlerror.URLError, ValueError):
            return None

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = _time.monotonic() + timeout
        while _time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"gradwatch serve exited with {self.process.returncode}:\n{self.log()}"
                )
            if self.health() is not None:
                return
            _time.sleep(0.05)  # poll interval of a readiness check, not synchronisation
        raise TimeoutError(f"gradwatch serve not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9: no shutdown, no flush; what was acknowledged must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(_signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), kill -9 if it does not end within 15 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(_signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except _subprocess.TimeoutExpired:
            self.kill()

    def restart(self, timeout: float = 60.0) -> ServerProcess:
        """Start again on the same port and database (after kill() or stop())."""
        if self.running:
            self.kill()
        return self.start(timeout)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def gradwatch_db(request: pytest.FixtureRequest, tmp_path: _Path) -> _Iterator[str]:
    """A fresh database for one test: a SQLite file, or a new PostgreSQL schema.

    Tests that take it run once per backend (ids `[sqlite]` and `[postgresql]`).
    """
    if request.param == "sqlite":
        yield str(tmp_path / "gradwatch.db")
        return
    url = request.getfixturevalue("postgres_url")
    import psycopg

    schema = "gw_" + _uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    yield f"{url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def gradwatch_server(
    tmp_path: _Path,
) -> _Iterator[_Callable[..., ServerProcess]]:
    """A factory of started servers: `server = gradwatch_server(db=None, token=None, ...)`.

    `db` defaults to a new SQLite file under tmp_path; pass `gradwatch_db` to run on both
    backends. Every server it started is stopped at teardown.
    """
    started: list[ServerProcess] = []

    def start(
        db: str | None = None,
        token: str | None = None,
        view_token: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> ServerProcess:
        name = f"server-{len(started)}"
        server = ServerProcess(
            db or str(tmp_path / f"{name}.db"), tmp_path / f"{name}.log", port=port,
            token=token, view_token=view_token, args=args, env=env,
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def shared_gradwatch_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> _Iterator[ServerProcess]:
    """One SQLite server for a whole test module, for tests that each use fresh run ids
    (rejections, hostile input): saves a server start per test."""
    folder = tmp_path_factory.mktemp("shared-server")
    server = ServerProcess(str(folder / "gradwatch.db"), folder / "server.log")
    server.start()
    yield server
    server.stop()
