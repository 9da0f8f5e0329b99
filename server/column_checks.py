"""The checks of step records sent as columns (docs/PROTOCOL.md, ``columns``) that
pydantic cannot express: every column as long as the block, counts not negative,
well-formed names. Plain functions of a validated block, importing none of the
models: server/schema.py runs them on every batch it parses, and server/columns.py
(the records a block stands for) builds on both.

Example:
    >>> ints(b"\\x04" + bytes(7)), floats(bytes(8))
    ([4], [0.0])
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from gradwatch.protocol import column_shapes as shared
from gradwatch.protocol import messages as m
from gradwatch.protocol.column_shapes import FLOAT_COLUMNS, PROFILE_KEYS

# The int64 columns besides `step` (the trainer's encoder names them all).
INT_COLUMNS = shared.INT_COLUMNS[1:]
NAMED_PREFIXES = ("param_norms/", "gate_norms/", "profile/")
_LITTLE = sys.byteorder == "little"


def _unpack(code: str, data: bytes) -> list[Any]:
    values = array(code)
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


def ints(data: bytes) -> list[int]:
    """Little-endian int64 values."""
    return _unpack("q", data)


def floats(data: bytes) -> list[float]:
    """Little-endian float64 values (NaN and infinities as floats)."""
    return _unpack("d", data)


def _length_problem(where: str, data: bytes, count: int, kind: str) -> str | None:
    if len(data) == 8 * count:
        return None
    return f"{where}: expected {count} {kind} values ({8 * count} bytes), got {len(data)} bytes"


def _name_problem(name: str) -> str | None:
    if not name.startswith(NAMED_PREFIXES):
        return "expected param_norms/<parameter>, gate_norms/<parameter>/<gate> or"
    head, _, tail = name.partition("/")
    if not tail:
        return "expected a name after the prefix in"
    if head == "gate_norms" and not tail.rpartition("/")[0]:
        return "expected gate_norms/<parameter>/<gate>, got"
    if head == "profile" and tail.rpartition("/")[2] not in PROFILE_KEYS:
        return "expected profile/<module>/<forward_s, backward_s or calls>, got"
    return None


def check_block(block: Any, where: str) -> str | None:
    """What is wrong with a validated block, a schema.StepColumns (``where``:
    ``columns[i]``), or None."""
    n = block.n
    problem = _length_problem(f"{where}.step", block.step.i64, n, "int64")
    if problem is None and min(ints(block.step.i64)) < 0:
        problem = f"{where}.step: expected integers >= 0, got {min(ints(block.step.i64))}"
    for name in (*INT_COLUMNS, "graph_truncated"):
        column = getattr(block, name)
        if problem is not None or column is None:
            continue
        problem = _length_problem(f"{where}.{name}", column.i64, n, "int64")
        if problem is None:
            values = ints(column.i64)
            low, high = (0, 1) if name == "graph_truncated" else (0, 2**63 - 1)
            if min(values) < low or max(values) > high:
                bad = next(v for v in values if not low <= v <= high)
                expected = "0 or 1" if name == "graph_truncated" else "integers >= 0"
                problem = f"{where}.{name}: expected {expected}, got {bad}"
    for name in FLOAT_COLUMNS:
        column = getattr(block, name)
        if problem is None and column is not None:
            problem = _length_problem(f"{where}.{name}", column.f64, n, "float64")
    if problem is None and block.named is not None:
        names = block.named.names
        for name in names:
            wrong = _name_problem(name)
            if wrong is not None:
                return f"{where}.named.names: {wrong} {name[:60]!r}"
        if len(set(names)) != len(names):
            return f"{where}.named.names: expected distinct names, got a name twice"
        problem = _length_problem(f"{where}.named.f64", block.named.f64, n * len(names), "float64")
    for module, series_map in (block.timesteps or {}).items():
        for series, column in series_map.items():
            if problem is None:
                problem = _length_problem(
                    f"{where}.timesteps.{module[:60]}.{series[:60]}.f64",
                    column.f64,
                    n * column.length,
                    "float64",
                )
    return problem


def check_batch(batch: Any) -> str | None:
    """The first problem of a batch's blocks, or None."""
    total = len(batch.records) + sum(block.n for block in batch.columns)
    if total > m.MAX_RECORDS_PER_BATCH:
        return (
            f"expected at most {m.MAX_RECORDS_PER_BATCH} records in a batch (records and"
            f" columns together), got {total}"
        )
    for i, block in enumerate(batch.columns):
        problem = check_block(block, f"columns[{i}]")
        if problem is not None:
            return problem
    return None
