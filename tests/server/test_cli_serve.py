"""What `gradwatch serve` tells the person who started it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gradwatch.server.cli import build_parser
from gradwatch.server.serving import serving_banner, settings_from
from gradwatch.server.settings import Settings


def test_loopback_banner_prints_the_tunnel_command_and_the_url() -> None:
    text = serving_banner(Settings(host="127.0.0.1", port=8765))
    assert "http://127.0.0.1:8765/" in text
    assert "ssh -N -L 8765:127.0.0.1:8765 " in text


def test_banner_with_tokens_gives_the_viewer_link_but_never_the_token() -> None:
    text = serving_banner(Settings(port=9000, token="secret-ingest", view_token="secret-view"))
    assert "?token=<your view token>" in text
    assert "secret" not in text


@pytest.mark.parametrize(
    ("flags", "variable", "in_a_process"),
    [
        ((), None, True),
        ((), "thread", False),
        (("--writer", "thread"), None, False),
        (("--writer", "process"), "thread", True),
        (("--writer", "thread"), "process", False),
    ],
)
def test_the_writer_flag_wins_over_the_variable(
    flags: tuple[str, ...], variable: str | None, in_a_process: bool
) -> None:
    args = build_parser().parse_args(["serve", *flags])
    environ = {} if variable is None else {"GRADWATCH_WRITER": variable}
    assert settings_from(args, environ).writer_process is in_a_process


def test_public_bind_without_token_is_refused_even_from_the_environment() -> None:
    env = {"GRADWATCH_HOST": "0.0.0.0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "serve"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines; expected --token" in done.stderr


def test_a_short_token_on_a_public_bind_is_refused_with_a_generated_suggestion(
    tmp_path: Path,
) -> None:
    for flags in (["--token", "a"], ["--token", "x" * 20, "--view-token", "short"]):
        done = subprocess.run(
            [sys.executable, "-m", "gradwatch.server.cli", "serve", "--host", "0.0.0.0",
             "--port", "9", "--db", str(tmp_path / "never.db"), *flags],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "expected at least 16 characters" in done.stderr
        assert "secrets.token_urlsafe" in done.stderr
        assert not (tmp_path / "never.db").exists()


def test_tokens_never_reach_the_log_and_a_lone_view_token_is_warned_about(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    token = "view-" + "q" * 24
    server = gradwatch_server(view_token=token, args=("--log-level", "info"))
    status, _, _ = wire.get(server, f"/api/runs?token={token}")
    assert status == 200
    with wire.connect(server, f"/ws/live?token={token}") as ws:
        assert wire.recv(ws)["type"] == "subscribed"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "/api/runs?token=<redacted>" not in server.log():
        time.sleep(0.05)  # polling the log file with a deadline
    log = server.log()
    assert "/api/runs?token=<redacted>" in log
    assert token not in log
    assert "--view-token without --token" in log


def test_a_database_that_cannot_be_written_is_one_line_with_path_and_cause() -> None:
    for path, cause in (("/proc/gradwatch-never.db", "No such file or directory"),
                        ("/sys/gradwatch-never.db", "Permission denied")):
        done = subprocess.run(
            [sys.executable, "-m", "gradwatch.server.cli", "serve", "--port", "9",
             "--db", path],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "serving" not in done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and path in lines[0] and cause in lines[0], lines
