"""Run an example scenario in-process and read back what it recorded."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol import read_spool

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Run = Callable[..., tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]


def load(name: str) -> Any:
    """The example script as a module (examples/ is not a package)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(
        f"gradwatch_example_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(path: Path) -> list[dict[str, Any]]:
    messages = list(read_spool(path))
    assert messages[0]["type"] == "hello"
    return [r for m in messages[1:] for r in m["records"]]


@pytest.fixture
def run_example(tmp_path: Path) -> Run:
    """run_example(name, *argv) -> (summary, step records, alert records), via a spool."""

    def run(
        name: str, *argv: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        spool = tmp_path / f"{name}.jsonl"
        summary = load(name).main([*argv, "--spool", str(spool), "--quiet"])
        recs = records(spool)
        steps = [r for r in recs if r["kind"] == "step"]
        alerts = [r for r in recs if r["kind"] == "alert"]
        return summary, steps, alerts

    return run


@pytest.fixture
def load_example() -> Callable[[str], Any]:
    """load_example(name) -> the example script as a module."""
    return load


@pytest.fixture
def spool_records() -> Callable[[Path], list[dict[str, Any]]]:
    """spool_records(path) -> every record of a spool, checking that it opens with hello."""
    return records
