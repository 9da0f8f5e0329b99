"""Fixtures of the integration tests: a spool's records, read back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol.columns import batch_records
from gradwatch.protocol.spool import read_spool

Records = Callable[[Path, str], list[dict[str, Any]]]


def _records(path: Path, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in read_spool(path):
        if message["type"] == "batch":
            out += [r for r in batch_records(message) if r["kind"] == kind]
    return sorted(out, key=lambda r: r.get("step") or 0)


@pytest.fixture
def spooled() -> Records:
    """`spooled(path, kind)`: the records of one kind in a spool, in step order (steps
    decoded from their columns)."""
    return _records
