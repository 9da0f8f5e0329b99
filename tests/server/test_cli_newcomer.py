"""The CLI as a newcomer meets it: --version, help with defaults, where report looks,
the messages a user reads (spool lines, warnings, the run's link, waiting at close)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from gradwatch.protocol.spool import SpoolError, read_spool
from gradwatch.server.cli import build_parser
from gradwatch.server.serving import serving_banner
from gradwatch.server.settings import Settings
from gradwatch.trainer_hooks import GradwatchWarning, watch


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.server.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_version_is_the_installed_distributions() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"gradwatch {metadata.version('gradwatch')}"


def test_every_option_of_every_command_has_help_that_shows_its_default() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    checked = 0
    for name, command in sub.choices.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            assert action.help, f"gradwatch {name} {action.option_strings[0]} has no help"
            assert "default" in action.help, (name, action.option_strings, action.help)
            checked += 1
    assert checked >= 20
    assert "(default 8765)" in " ".join(cli("demo", "--help").stdout.split())


def test_the_tunnel_hint_is_a_hint_for_remote_use_after_the_serving_line() -> None:
    first, *rest = serving_banner(Settings(host="127.0.0.1", port=8765)).splitlines()
    assert first.startswith("gradwatch: serving on http://127.0.0.1:8765/")
    (hint,) = [line for line in rest if "ssh -N -L" in line]
    assert hint.lstrip().startswith("hint, if your browser is on another machine:")


def test_serve_on_a_port_in_use_is_one_line_naming_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("serve", "--port", str(port), "--db", str(tmp_path / "x.db"))
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert f"port {port}" in line and "--port" in line


def _own_data_dir(tmp_path: Path) -> dict[str, str]:
    """An environment whose per-user data folder is under tmp_path, no $GRADWATCH_DB."""
    return {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "data"),
            "GRADWATCH_DB": ""}


def test_report_without_a_database_says_where_it_looked_and_names_db(tmp_path: Path) -> None:
    env = _own_data_dir(tmp_path)
    default = tmp_path / "data" / "gradwatch" / "gradwatch.db"
    done = cli("report", "some-run", cwd=tmp_path, env=env)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"looked in {default}" in line and "--db PATH" in line, line
    assert "demo.db" not in line  # one default, not a search of several
    # A database an earlier version left in this folder is named, with the flag.
    (tmp_path / "gradwatch.db").write_bytes(b"")
    done = cli("report", "some-run", cwd=tmp_path, env=env)
    assert "this folder holds gradwatch.db" in done.stderr and "--db gradwatch.db" in done.stderr
    assert not default.exists()  # reading a report never creates a database


@contextlib.contextmanager
def _serve_without_db(cwd: Path, env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """A real `gradwatch serve` given no --db; yields (ws url, its stderr file)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = cwd / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gradwatch.server.cli", "serve", "--port", str(port),
             "--log-level", "warning"], cwd=cwd, stdout=out, stderr=out,
            env=dict(os.environ, **env))
    try:
        deadline = time.monotonic() + 60
        while True:  # a readiness poll, bounded
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield f"ws://127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_and_report_share_one_default_database_from_any_folder(
    tmp_path: Path, wire: Any
) -> None:
    env = _own_data_dir(tmp_path)
    default = tmp_path / "data" / "gradwatch" / "gradwatch.db"
    trained_in, reported_in = tmp_path / "project", tmp_path / "elsewhere"
    trained_in.mkdir()
    reported_in.mkdir()
    (trained_in / "gradwatch.db").write_bytes(b"")  # what an earlier version left here
    with _serve_without_db(trained_in, env) as (url, log):
        server = argparse.Namespace(url=url)
        run_id = wire.run_id()
        with wire.connect(server) as ws:
            ws.send(json.dumps(wire.hello(run_id, run="in-the-default")))
            ws.send(json.dumps(wire.batch(run_id, 0, [wire.step(i) for i in range(3)])))
            assert wire.recv(ws)["seq"] == 0
    said = log.read_text()
    assert f"the database is {default}" in said and "--db gradwatch.db" in said, said
    assert default.is_file() and (trained_in / "gradwatch.db").stat().st_size == 0
    done = cli("report", "in-the-default", "-o", str(reported_in / "r.html"),
               cwd=reported_in, env=env)
    assert done.returncode == 0, done.stderr
    assert "in-the-default" in (reported_in / "r.html").read_text()
    # $GRADWATCH_DB moves the one default for every command; --db wins over it.
    moved = cli("report", "in-the-default", "-o", str(reported_in / "m.html"), cwd=reported_in,
                env={**env, "GRADWATCH_DB": str(tmp_path / "other.db")})
    assert moved.returncode == 2 and f"looked in {tmp_path / 'other.db'}" in moved.stderr
    given = cli("report", "in-the-default", "-o", str(reported_in / "g.html"), "--db",
                str(default), cwd=reported_in, env={**env, "GRADWATCH_DB": "/nowhere.db"})
    assert given.returncode == 0, given.stderr


def test_the_demo_writes_the_same_default_database(tmp_path: Path) -> None:
    from gradwatch.server.demo import plan

    env = _own_data_dir(tmp_path)
    args = argparse.Namespace(port=8765, db=None, replay=True, only=None, steps=None)
    code = ("import argparse, sys; from gradwatch.server.demo import plan; "
            "from gradwatch.server.settings import default_db; "
            f"p = plan(argparse.Namespace(**{vars(args)!r})); "
            "print(p.db); print(default_db())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=60, check=True)
    demo_db, default = done.stdout.split()
    assert demo_db == default == str(tmp_path / "data" / "gradwatch" / "gradwatch.db")
    assert plan(argparse.Namespace(**{**vars(args), "db": "x.db"})).db == Path("x.db")


@pytest.mark.parametrize(
    ("line", "expected"),
    [('{"records": [], "seq": 1}', "got an object without it (keys: 'records', 'seq')"),
     ("[1, 2]", "got list [1, 2]"),
     ('"hello"', 'got str "hello"')],
)
def test_a_bad_spool_line_says_what_it_got(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"type": "hello"}\n' + line + "\n")
    with pytest.raises(SpoolError) as caught:
        list(read_spool(path))
    message = str(caught.value)
    assert f"run.jsonl:2: expected a JSON object with a 'type' field, {expected}" in message


def test_warnings_point_at_the_users_line_even_from_the_background_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = watch(model, run="w", server="ws://127.0.0.1:9", spool=tmp_path / "s.jsonl",
                        diagnose=False)
        model(torch.randn(1, 2)).sum().backward()
        monitor.step()
        monitor.close(timeout=1.0)
        monitor.step()
    ours = [w for w in caught if issubclass(w.category, GradwatchWarning)]
    texts = [str(w.message) for w in ours]
    assert any("cannot reach" in t for t in texts), texts  # raised on the sender's thread
    assert any("step() after close()" in t for t in texts), texts
    assert {w.filename for w in ours} == {__file__}, [(w.filename, w.lineno) for w in ours]
    # said before the wait: a program that seems to hang at its end says why
    assert "is not answering; waiting up to 1 s for it" in capsys.readouterr().err


STREAM = """
import torch
from gradwatch.trainer_hooks import watch
model = torch.nn.Linear(2, 2)
with watch(model, run="linked", server={url!r}, spool={spool!r}, diagnose=False,
           quiet={quiet}) as monitor:
    for _ in range(3):
        model(torch.randn(1, 2)).sum().backward()
        monitor.step()
    assert monitor.flush(30)
print("run_id", monitor.run_id)
"""


@pytest.mark.parametrize(
    ("quiet", "env"), [(False, {}), (True, {}), (False, {"GRADWATCH_QUIET": "1"})]
)
def test_watch_prints_one_line_with_the_runs_link_when_it_connects(
    gradwatch_server: Callable[..., Any], tmp_path: Path, quiet: bool, env: dict[str, str]
) -> None:
    server = gradwatch_server()
    script = STREAM.format(url=server.url, spool=str(tmp_path / "s.jsonl"), quiet=quiet)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env))
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[-1]
    lines = [line for line in done.stderr.splitlines() if "streaming run" in line]
    if quiet or env:
        assert lines == []
    else:
        assert lines == [f"gradwatch: streaming run linked to {server.http}/#/run/{run_id}/0"]
