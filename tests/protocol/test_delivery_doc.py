"""docs/DELIVERY.md's table of the sender's knobs holds the defaults of
``WebSocketSink`` (a default changed in the code without the doc fails here)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from gradwatch.protocol.sender import WebSocketSink

DOC = (Path(__file__).resolve().parents[2] / "docs" / "DELIVERY.md").read_text()
UNITS = {"MiB": 1 << 20, "s": 1}


def _value(text: str) -> float:
    """``"8 MiB"`` -> 8388608, ``"0.05 s"`` -> 0.05, ``"64"`` -> 64."""
    number, _, unit = text.strip().partition(" ")
    return float(number) * UNITS.get(unit, 1)


def test_the_knobs_table_of_delivery_md_holds_the_senders_defaults() -> None:
    table = DOC.split("## Knobs", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (`.+?`) \| (.+?) \|", table, re.MULTILINE)
    documented = {}
    for names, values in rows:
        for name, value in zip(re.findall(r"`(\w+)`", names), values.split(","), strict=True):
            documented[name] = _value(value)
    defaults = inspect.signature(WebSocketSink.__init__).parameters
    assert len(documented) >= 6
    assert {name: defaults[name].default for name in documented} == documented
