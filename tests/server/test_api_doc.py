"""docs/API.md's figures are the server's: its defaults, limits and headers, and every
``GRADWATCH_*`` variable it names is one the settings read (a value changed in the code
without the doc fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from gradwatch.server import api, settings
from gradwatch.server.security import security_headers
from gradwatch.server.settings import Settings

DOC = " ".join((Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text().split())


def test_the_defaults_api_md_names_are_the_settings_defaults() -> None:
    s = Settings()
    said = [
        f"`GRADWATCH_MAX_MESSAGE_BYTES` (default {s.max_message_bytes >> 20} MiB)",
        f"`GRADWATCH_LIVE_QUEUE_SIZE` (default {s.live_queue_size} messages per viewer)",
        f"`GRADWATCH_SQLITE_SYNCHRONOUS` (`{s.sqlite_synchronous}` default",
        f"`GRADWATCH_STALE_AFTER_S` (default {s.stale_after_s:g})",
        f"`GRADWATCH_WRITER_STALL_S` (default {s.writer_stall_s:g})",
        f"up to {s.ingest_window} batches per connection",
        f"in messages ({s.live_queue_size}, `GRADWATCH_LIVE_QUEUE_SIZE`)",
        f"in bytes ({s.live_queue_bytes >> 20} MiB, `GRADWATCH_LIVE_QUEUE_BYTES`)",
        f"takes no message for {s.live_send_timeout_s:g} s",
        f"must arrive within {s.header_timeout_s:g} s",
        f"at most {s.max_connections:,} connections are served at once",
        f"wrote within the last {s.stale_after_s:g} s",
        f"longer ago than {s.stalled_factor:g} times its median step time, and at least"
        f" {s.stalled_min_s:g} s",
        f"none was answered for {s.writer_stall_s:g} s (`GRADWATCH_WRITER_STALL_S`)",
        f"within {api.HEALTH_TIMEOUT_S:g} s",
        f"one answer holds at most {api.MAX_CELLS:,} values",
        f"(default and limit {api.MAX_CELLS:,})",
    ]
    assert [text for text in said if text not in DOC] == []


def test_the_headers_api_md_quotes_are_the_ones_sent() -> None:
    sent = dict(security_headers(Settings()))
    csp = sent[b"content-security-policy"].decode()
    assert f"`Content-Security-Policy: {csp}`" in DOC
    for name in (b"x-content-type-options", b"referrer-policy", b"cross-origin-opener-policy"):
        assert sent[name].decode() in DOC, name


def test_every_variable_api_md_names_is_read_by_the_settings() -> None:
    source = Path(settings.__file__).read_text()
    named = set(re.findall(r"GRADWATCH_[A-Z_]+", DOC))
    assert len(named) > 10
    assert sorted(v for v in named if f'"{v}"' not in source) == []
