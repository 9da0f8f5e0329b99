"""Rollups of a group of series computed column by column, where a value is not a
finite number (the writer's path for numpy matrices is store/set_rollups.py).

A chunk's series share their steps, so the block boundaries of every level are found
once per group, and each series' min and max per block is a C-level ``min()``/``max()``
over a slice of its column. Ties keep the earliest step; values order as ``key``
(the backend's order, store/rollups.py) orders them.

Example:
    >>> group = Group([3, 70, 65], [0, 1, 2], [7], [(2.0, "NaN", 1.0)])
    >>> [row for row in set_blocks(group, rollups.sqlite_key) if row[0] == 6]
    [(6, 0, 1, 3, 3, [3, 2.0, 3, 2.0]), (6, 1, 2, 65, 70, [65, 1.0, 70, 'NaN'])]
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
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
    # The kind of each series (store/set_rollups.py): "q" int64, "d" float64.
    kinds: str = ""
    # Or the values as one numpy array, ``matrix[i, k]`` of series k at ``steps[i]``
    # (all finite, one dtype; ``columns`` is then empty).
    matrix: Any = None


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
