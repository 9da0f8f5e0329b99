"""Fixtures of the integration tests: a spool's records, read back; a graph's size."""

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


def _graph_size(root: Any) -> int:
    seen: set[int] = set()
    stack, keep = [root], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)  # alive while counting, so that ids stay unique
        stack.extend(child for child, _ in node.next_functions)
    return len(seen)


@pytest.fixture
def graph_size() -> Callable[[Any], int]:
    """`graph_size(grad_fn)`: the autograd nodes reachable from it, counted
    independently of gradwatch."""
    return _graph_size
