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
from collections.abc import Callable, Iterable, Sequence
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
    # The kind of each series (store/set_rollups.py) when the group's rollups are kept
    # as one row per set of series; empty: one row per series.
    kinds: str = ""
    # Or the values as one numpy array, ``matrix[i, k]`` of series k at ``steps[i]``
    # (all finite, one dtype; ``columns`` is then empty).
    matrix: Any = None


# (series, level, block) -> [min_step, min_v, max_step, max_v, n, min_order, max_order]
_Blocks = dict[tuple[int, int, int], list[Any]]


def aggregate_columns(groups: Iterable[Group], key: rollups.Key) -> list[tuple[Any, ...]]:
    """Rollup rows ``(series, level, block, min_step, min_v, max_step, max_v, n)`` of
    every level (for :data:`gradwatch.server.store.rollups.UPSERT`)."""
    groups = [g for g in groups if g.steps]
    # A series in one group only (nearly all) goes straight out; one in several name
    # sets of the batch has its blocks merged.
    seen: set[int] = set()
    shared: set[int] = set()
    for group in groups:
        for series in group.series:
            if series in seen:
                shared.add(series)
            seen.add(series)
    out: list[tuple[Any, ...]] = []
    merged: _Blocks = {}
    for group in groups:
        _add_group(out, merged, shared, group, key)
    out.extend((s, lv, blk, b[0], b[1], b[2], b[3], b[4]) for (s, lv, blk), b in merged.items())
    return out


# (level, block, first finest block, last + 1, number of values)
_Span = tuple[int, int, int, int, int]


def _spans(
    group: Group,
) -> tuple[list[int], Sequence[int], Sequence[Sequence[Any]], list[tuple[int, int]], list[_Span]]:
    """A group's steps, order and columns sorted by step, the finest level's blocks as
    index ranges of the sorted steps, and every level's blocks as runs of them."""
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
    # The finest level's blocks as index ranges of the sorted steps, found once for
    # every column; a coarser block is a run of consecutive finest blocks.
    finest = rollups.LEVELS[0]
    fine: list[tuple[int, int]] = []
    blocks: list[int] = []
    i = 0
    while i < n:
        block = steps[i] >> finest
        j = bisect_left(steps, (block + 1) << finest, i)
        fine.append((i, j))
        blocks.append(block)
        i = j
    spans = [
        (finest, b, k, k + 1, j - i) for k, (b, (i, j)) in enumerate(zip(blocks, fine, strict=True))
    ]
    spans += (
        (level, block, k, m, fine[m - 1][1] - fine[k][0])
        for level, block, k, m in rollups.coarser(blocks)
    )
    return steps, order, columns, fine, spans


def set_blocks(group: Group, key: rollups.Key) -> list[tuple[int, int, int, int, int, list[Any]]]:
    """A group's rollups as one row per block of every level for all its series
    together (store/set_rollups.py): ``(level, block, n, first step, last step,
    values)``, ``values`` holding ``min_step, min_v, max_step, max_v`` of each series
    in the group's order, chosen as :func:`aggregate_columns` chooses them."""
    steps, _, columns, fine, spans = _spans(group)
    extremes = [_extremes(column, fine, key) for column in columns]
    out: list[tuple[int, int, int, int, int, list[Any]]] = []
    for level, block, k, m, count in spans:
        values: list[Any] = []
        for column, (lows, highs, rank) in zip(columns, extremes, strict=True):
            if m - k == 1:
                lo, hi = lows[k], highs[k]
            else:
                lo, hi = min(lows[k:m], key=rank), max(highs[k:m], key=rank)
            values += (steps[lo], column[lo], steps[hi], column[hi])
        out.append((level, block, count, steps[fine[k][0]], steps[fine[m - 1][1] - 1], values))
    return out


def _add_group(
    out: list[tuple[Any, ...]], merged: _Blocks, shared: set[int], group: Group, key: rollups.Key
) -> None:
    steps, order, columns, fine, spans = _spans(group)
    for series, column in zip(group.series, columns, strict=True):
        lows, highs, rank = _extremes(column, fine, key)
        for level, block, k, m, count in spans:
            if m - k == 1:
                lo, hi = lows[k], highs[k]
            else:
                # The extremes of a run of blocks are among theirs; min()/max() keep the
                # first of equal ones, the earliest step.
                lo, hi = min(lows[k:m], key=rank), max(highs[k:m], key=rank)
            if series not in shared:
                out.append(
                    (series, level, block, steps[lo], column[lo], steps[hi], column[hi], count)
                )
                continue
            row = [steps[lo], column[lo], steps[hi], column[hi], count, order[lo], order[hi]]
            previous = merged.get((series, level, block))
            if previous is None:
                merged[series, level, block] = row
            else:
                _merge(previous, row, key)


def _extremes(
    column: Sequence[Any], fine: list[tuple[int, int]], key: rollups.Key
) -> tuple[list[int], list[int], Callable[[int], Any]]:
    """Index of the min and of the max of ``column[i:j]`` per ``(i, j)`` (the first of
    equal values, i.e. the earliest step: the column is in step order), and what
    ranks an index (its value, or its value's ``key``)."""
    lows: list[int] = []
    highs: list[int] = []
    try:
        # NaN (or inf - inf) makes the sum NaN, a "NaN" string makes it fail: only then
        # do values need the backend's order; plain numbers compare as they are.
        total = sum(column)
        plain = total == total
    except TypeError:
        plain = False
    if plain:
        for i, j in fine:
            part = column[i:j]
            # min() returns the first of equal values and index() finds the first equal
            # one: the same element, found in C.
            lows.append(i + part.index(min(part)))
            highs.append(i + part.index(max(part)))
        return lows, highs, column.__getitem__
    keys = [key(v) for v in column]
    rank = keys.__getitem__
    for i, j in fine:
        lows.append(min(range(i, j), key=rank))
        highs.append(max(range(i, j), key=rank))
    return lows, highs, rank


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
