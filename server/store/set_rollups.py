"""Rollups of the series that came together in a chunk, one row per set of series.

A chunk (store/chunks.py) brings ~35 series that share their steps: the plain fields
and a name set's named scalars. Kept one per series (store/rollups.py), a transaction
upserted ~10 rollup rows of each (the finest blocks it touched and one per coarser
level): about one row per record, and a third of SQLite's writer time at 40,000
records/s (BENCHMARKS.md, "Ingest: rollups per set of series"). Here a chunk's series
keep ONE row per (set, level, block) together:

- ``rollup_sets``: a set's series ids (``series``, comma-separated, in order) and
  their ``kinds``, one letter each: ``q`` int64 values, ``d`` float64;
- ``rollup_members``: which sets a series is in, and where;
- ``set_rollups``: per block, the number of records (``n``), their first and last
  step, and ``data``: per series in set order 32 bytes, ``min_step`` (int64), the min
  value, ``max_step`` (int64), the max value, as the kind says. Non-finite floats are
  stored as float64 and read back as the backend stores them (SQLite: the strings
  "NaN", "Infinity", "-Infinity"), so they order as the per-series rollups do.

The same block of a set written again (the next batch of it) is merged with the
stored row by the per-series rule: the lower (higher) value wins, then the earlier
step (numpy where both are finite, :func:`merge_arrays`; else :func:`merge`).
SQLite's writer holds the database's write lock from the chunk inserts before it to
the commit, so no other write lands in between. Reads (store/history.py) take a
series' rows from both layouts and merge them per bucket.

Example:
    >>> layout = Layout(7, "qd")
    >>> row = layout.pack([3, 3, 70, 70, 3, 2.5, 65, float("inf")])
    >>> series_at(row, 1, "d", str)
    (3, 2.5, 65, 'inf')
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import rollups

SET_INSERT = (
    "INSERT INTO set_rollups (set_id, level, block, n, step_lo, step_hi, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (set_id, level, block) DO UPDATE SET"
    " n = excluded.n, step_lo = excluded.step_lo, step_hi = excluded.step_hi,"
    " data = excluded.data"
)
SERIES_ROWS = (
    "SELECT m.position, m.kind, r.block, r.data FROM rollup_members m JOIN set_rollups r"
    " ON r.set_id = m.set_id WHERE m.series = ? AND r.level = ? AND r.block >= ?"
    " AND r.block <= ?"
)
STEP_COUNT = (
    "SELECT SUM(r.n), MIN(r.step_lo), MAX(r.step_hi) FROM rollup_members m"
    " JOIN set_rollups r ON r.set_id = m.set_id WHERE m.series = ? AND r.level = ?"
    " AND r.block >= ? AND r.block <= ?"
)
_ONE = {kind: struct.Struct(f"<q{kind}q{kind}") for kind in "qd"}
# A row of a set whose series are all of one kind, as a numpy record per series.
ROW_DTYPES = {
    kind: np.dtype([("ls", "<i8"), ("lv", f"<{kind}8"), ("hs", "<i8"), ("hv", f"<{kind}8")])
    for kind in ("i", "f")
}


def schema(integer: str, blob: str, serial: str, clustered: str) -> list[str]:
    """CREATE statements of the tables above."""
    return [
        f"CREATE TABLE IF NOT EXISTS rollup_sets (id {serial}, series TEXT NOT NULL UNIQUE,"
        " kinds TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS rollup_members (series {integer} NOT NULL,"
        f" set_id {integer} NOT NULL, position {integer} NOT NULL, kind TEXT NOT NULL,"
        f" PRIMARY KEY (series, set_id)){clustered}",
        f"CREATE TABLE IF NOT EXISTS set_rollups (set_id {integer} NOT NULL,"
        f" level {integer} NOT NULL, block {integer} NOT NULL, n {integer} NOT NULL,"
        f" step_lo {integer} NOT NULL, step_hi {integer} NOT NULL, data {blob} NOT NULL,"
        f" PRIMARY KEY (set_id, level, block)){clustered}",
    ]


@dataclass
class Layout:
    """One set's id and the packing of its rows."""

    id: int
    kinds: str
    packing: struct.Struct = field(init=False)

    def __post_init__(self) -> None:
        self.packing = struct.Struct("<" + "".join(f"q{k}q{k}" for k in self.kinds))

    def pack(self, values: Sequence[Any]) -> bytes:
        """``min_step, min_v, max_step, max_v`` of each series, values as stored (the
        strings "NaN" and the infinities become float64 again)."""
        if any(type(v) is str for v in values):
            values = [float(v) if type(v) is str else v for v in values]
        return self.packing.pack(*values)

    def unpack(self, data: bytes, stored: Callable[[float], Any]) -> list[Any]:
        """Every series' four numbers, non-finite floats as the backend stores them."""
        values = list(self.packing.unpack(data))
        return [v if type(v) is int or v - v == 0 else stored(v) for v in values]


def series_at(
    data: bytes, position: int, kind: str, stored: Callable[[float], Any]
) -> tuple[Any, ...]:
    """``(min_step, min_v, max_step, max_v)`` of the series at ``position`` of a row."""
    lo_step, lo, hi_step, hi = _ONE[kind].unpack_from(data, 32 * position)
    if kind == "d":
        lo = lo if lo - lo == 0 else stored(lo)
        hi = hi if hi - hi == 0 else stored(hi)
    return lo_step, lo, hi_step, hi


def merge(old: list[Any], new: list[Any], key: rollups.Key) -> list[Any]:
    """Two rows' values of one block (``min_step, min_v, max_step, max_v`` per series),
    ``new`` written after ``old``: the per-series upsert's rule (the lower value, then
    the earlier step; the higher value, then the earlier step)."""
    out = list(old)
    for at in range(0, len(new), 4):
        lo_step, lo, hi_step, hi = new[at : at + 4]
        lo_new, lo_old = key(lo), key(old[at + 1])
        if lo_new < lo_old or (lo_new == lo_old and lo_step < old[at]):
            out[at], out[at + 1] = lo_step, lo
        hi_new, hi_old = key(hi), key(old[at + 3])
        if hi_new > hi_old or (hi_new == hi_old and hi_step < old[at + 2]):
            out[at + 2], out[at + 3] = hi_step, hi
    return out


def array_blocks(
    steps: np.ndarray, matrix: np.ndarray
) -> tuple[list[tuple[int, int, int, int, int]], np.ndarray]:
    """:func:`gradwatch.server.store.columns.set_blocks` in numpy, for a group whose
    values are all finite numbers of one dtype: ``matrix[i, k]`` is series k's value
    at ``steps[i]``. Returns each block's ``(level, block, n, first step, last step)``
    and, row for row, its values: one record of :data:`ROW_DTYPES` per series (the
    bytes of a row's ``data``). argmin/argmax keep the first of equal values, and the
    records are in step order (a stable sort where they were not, keeping equal steps
    in batch order): ties keep the earliest step, as there."""
    if steps.size > 1 and bool((steps[1:] < steps[:-1]).any()):
        order = np.argsort(steps, kind="stable")
        steps, matrix = steps[order], matrix[order]
    finest = rollups.LEVELS[0]
    blocks = steps >> finest
    cuts = (np.flatnonzero(blocks[1:] != blocks[:-1]) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, int(steps.size)]
    fine = blocks[starts].tolist()
    step_list = steps.tolist()
    columns = np.arange(matrix.shape[1])
    # Index (into steps) of each series' min and max per block: the finest blocks
    # first, then the coarser ones (at most as many as the finest, per level).
    lows = np.empty((len(fine) * len(rollups.LEVELS), matrix.shape[1]), np.intp)
    highs = np.empty_like(lows)
    for f, (i, j) in enumerate(zip(starts, ends, strict=True)):
        part = matrix[i:j]
        lows[f] = part.argmin(0)
        highs[f] = part.argmax(0)
        lows[f] += i
        highs[f] += i
    found = [
        (finest, fine[f], ends[f] - starts[f], step_list[starts[f]], step_list[ends[f] - 1])
        for f in range(len(fine))
    ]
    for level, block, k, m in rollups.coarser(fine):
        at = len(found)
        if m - k == 1:
            lows[at], highs[at] = lows[k], highs[k]
        else:
            # A coarser block's extremes are among its finest blocks'; the first of
            # equal ones is the earliest step.
            lo, hi = lows[k:m], highs[k:m]
            lows[at] = lo[matrix[lo, columns].argmin(0), columns]
            highs[at] = hi[matrix[hi, columns].argmax(0), columns]
        first, last = step_list[starts[k]], step_list[ends[m - 1] - 1]
        found.append((level, block, ends[m - 1] - starts[k], first, last))
    lo, hi = lows[: len(found)], highs[: len(found)]
    rows = np.empty(lo.shape, ROW_DTYPES[matrix.dtype.kind])
    rows["ls"], rows["lv"] = steps[lo], matrix[lo, columns]
    rows["hs"], rows["hv"] = steps[hi], matrix[hi, columns]
    return found, rows


def merge_arrays(old: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """:func:`merge` of rows as numpy records (elementwise: one row or many), or None
    when a stored row holds a non-finite float (then only the backend's order,
    :func:`merge`, says)."""
    if old["lv"].dtype.kind == "f" and not (
        np.isfinite(old["lv"]).all() and np.isfinite(old["hv"]).all()
    ):
        return None
    out = old.copy()
    low = (new["lv"] < old["lv"]) | ((new["lv"] == old["lv"]) & (new["ls"] < old["ls"]))
    out["ls"][low], out["lv"][low] = new["ls"][low], new["lv"][low]
    high = (new["hv"] > old["hv"]) | ((new["hv"] == old["hv"]) & (new["hs"] < old["hs"]))
    out["hs"][high], out["hv"][high] = new["hs"][high], new["hv"][high]
    return out


def kind_of(name: str, ints: frozenset[str]) -> str:
    """``q`` for the series of int64 columns (and the step numbers), else ``d``."""
    return "q" if name == rollups.STEP_SERIES or name in ints else "d"
