"""What `gradwatch serve` tells the person who started it."""

from __future__ import annotations

import subprocess
import sys

from gradwatch.server.cli import serving_banner
from gradwatch.server.settings import Settings


def test_loopback_banner_prints_the_tunnel_command_and_the_url() -> None:
    text = serving_banner(Settings(host="127.0.0.1", port=8765))
    assert "http://127.0.0.1:8765/" in text
    assert "ssh -N -L 8765:127.0.0.1:8765 " in text


def test_banner_with_tokens_gives_the_viewer_link_but_never_the_token() -> None:
    text = serving_banner(Settings(port=9000, token="secret-ingest", view_token="secret-view"))
    assert "?token=<your view token>" in text
    assert "secret" not in text


def test_public_bind_without_token_is_refused_even_from_the_environment() -> None:
    env = {"GRADWATCH_HOST": "0.0.0.0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "serve"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines; expected --token" in done.stderr
