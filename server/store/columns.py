"""Rollups of a batch computed column by column (the writer's path; store/rollups.py).

A batch's named scalars arrive as one value list per record in the order of a name
set (store/named.py), its plain fields as the columns of its ``steps`` rows. Records
sharing a name set share their steps, so the block boundaries of every level are
found once per group of records, and each series' min and max per block is a C-level
``min()``/``max()`` over a slice of its column (transposed with ``zip``), instead of
one Python tuple per (series, step, value) sorted and cut per series. The result is
row for row what :func:`gradwatch.server.store.rollups.aggregate` gives for the same
values (tests/server/test_named_scalars.py compares them): ties keep the earliest
step, then the earliest record of the batch; values order as ``key`` orders them.

Example:
    >>> rows = aggregate_columns([Group([3, 70, 65], [0, 1, 2], [7], [(2.0, 5.0, 1.0)])],
    ...                          rollups.sqlite_key)
    >>> sorted(r for r in rows if r[1] == 6)
    [(7, 6, 0, 3, 2.0, 3, 2.0, 1), (7, 6, 1, 65, 1.0, 70, 5.0, 2)]
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import rollups


@dataclass
class Group:
    """Records of one batch with the same series: ``columns[k]`` holds the values of
    series ``series[k]``, aligned with ``steps``; ``order`` is each record's place in
    the batch (its uid), which breaks ties between equal steps."""

    steps: Sequence[int]
    order: Sequence[int]
    series: Sequence[int]
    columns: Sequence[Sequence[Any]]


# (series, level, block) -> [min_step, min_v, max_step, max_v, n, min_order, max_order]
_Blocks = dict[tuple[int, int, int], list[Any]]


def aggregate_columns(groups: Iterable[Group], key: rollups.Key) -> list[tuple[Any, ...]]:
    """Rollup rows ``(series, level, block, min_step, min_v, max_step, max_v, n)`` of
    every level (for :data:`gradwatch.server.store.rollups.UPSERT`)."""
    out: _Blocks = {}
    for group in groups:
        if group.steps:
            _add_group(out, group, key)
    return [(s, lv, blk, b[0], b[1], b[2], b[3], b[4]) for (s, lv, blk), b in out.items()]


def _add_group(out: _Blocks, group: Group, key: rollups.Key) -> None:
    steps, order, columns = list(group.steps), group.order, group.columns
    ordered = sorted(steps)
    if ordered != steps:
        # A shuffled batch (rare): sort the records by step once for all the columns;
        # a stable sort keeps equal steps in batch order, as rollups.aggregate does.
        perm = sorted(range(len(steps)), key=steps.__getitem__)
        order = [order[i] for i in perm]
        columns = [[column[i] for i in perm] for column in columns]
    steps = ordered
    n = len(steps)
    # The index ranges of every level's blocks; a batch of 100 consecutive steps has
    # ~5 blocks over 4 levels but only ~3 distinct ranges (the coarse levels repeat).
    spans: list[tuple[int, int, int, int]] = []  # (level, block, range index, count)
    ranges: dict[tuple[int, int], int] = {}
    for level in rollups.LEVELS:
        i = 0
        while i < n:
            block = steps[i] >> level
            j = bisect_left(steps, (block + 1) << level, i)
            spans.append((level, block, ranges.setdefault((i, j), len(ranges)), j - i))
            i = j
    bounds = list(ranges)
    for series, column in zip(group.series, columns, strict=True):
        found = _extremes(column, bounds, key)
        for level, block, at, count in spans:
            lo, hi = found[at]
            row = [steps[lo], column[lo], steps[hi], column[hi], count, order[lo], order[hi]]
            previous = out.get((series, level, block))
            if previous is None:
                out[series, level, block] = row
            else:
                _merge(previous, row, key)


def _extremes(
    column: Sequence[Any], bounds: list[tuple[int, int]], key: rollups.Key
) -> list[tuple[int, int]]:
    """(index of the min, index of the max) of ``column[i:j]`` per ``(i, j)``: the
    first of equal values, i.e. the earliest step (the column is in step order)."""
    try:
        # NaN (or inf - inf) makes the sum NaN, a "NaN" string makes it fail: only then
        # do values need the backend's order; plain numbers compare as they are.
        total = sum(column)
        plain = total == total
    except TypeError:
        plain = False
    found: list[tuple[int, int]] = []
    if plain:
        for i, j in bounds:
            part = column[i:j]
            # min() returns the first of equal values and index() finds the first equal
            # one: the same element, found in C.
            found.append((i + part.index(min(part)), i + part.index(max(part))))
        return found
    keys = [key(v) for v in column]
    at = keys.__getitem__
    for i, j in bounds:
        found.append((min(range(i, j), key=at), max(range(i, j), key=at)))
    return found


def _merge(into: list[Any], row: list[Any], key: rollups.Key) -> None:
    """Fold another group's block into ``into``: the lower (higher) value wins, then
    the earlier step, then the earlier record of the batch."""
    into[4] += row[4]
    lo_new, lo_old = key(row[1]), key(into[1])
    if lo_new < lo_old or (lo_new == lo_old and (row[0], row[5]) < (into[0], into[5])):
        into[0], into[1], into[5] = row[0], row[1], row[5]
    hi_new, hi_old = key(row[3]), key(into[3])
    if hi_new > hi_old or (hi_new == hi_old and (row[2], row[6]) < (into[2], into[6])):
        into[2], into[3], into[6] = row[2], row[3], row[6]
