"""Min/max rollups of every scalar series, kept at ingest, so history never scans 1e6 rows.

For each series (a plain field, a named scalar or the step numbers, each with an id
in ``series``) and each level ``L`` of :data:`LEVELS`, its set's row
(store/set_rollups.py) holds per block of ``2**L`` steps (``block = step >> L``) the
step and value of the block's min and of its max. The history API's buckets are
aligned blocks of ``2**k`` steps (:func:`gradwatch.server.downsample.bucket_width`),
so a bucket is exactly the union of ``2**(k-L)`` rollup rows of the largest level
``L <= k``: a 1e6-step series answers 2,000 points from ~1,000 rollup rows.

Ties keep the earliest step, for the min and the max alike (the reference's rule).
Values order as each backend orders them (``key``): in SQLite numbers before text, so
the ``"NaN"``/``"Infinity"`` strings win every max; in PostgreSQL NaN above +inf.

Example:
    >>> level_for(2048), cover(10, 2000)[0]
    (10, [(6, 1, 30)])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# Levels 16x apart: a bucket merges at most 16 rows of the level below it, and a batch
# of 100 steps upserts ~6 rows per series (4 levels), a few % of its insert cost.
LEVELS = (6, 10, 14, 18)
# The series of the step numbers themselves, per (run, rank): its rollups' counts and
# first/last steps answer the history's `total` without counting 1e6 rows.
STEP_SERIES = "step"

Key = Callable[[Any], tuple[int, Any]]


def sqlite_key(value: Any) -> tuple[int, Any]:
    """SQLite's order: every number before every text value, text by its bytes."""
    return (1, value) if isinstance(value, str) else (0, value)


def postgres_key(value: Any) -> tuple[int, Any]:
    """PostgreSQL's float8 order: NaN above +Infinity, all NaNs equal."""
    return (1, 0.0) if isinstance(value, float) and math.isnan(value) else (0, value)


def coarser(fine: list[int]) -> list[tuple[int, int, int, int]]:
    """The blocks of every level above the finest, as runs of the finest blocks
    ``fine`` (ascending block numbers): ``(level, block, first index, last + 1)``.

    >>> coarser([0, 1, 16])
    [(10, 0, 0, 2), (10, 1, 2, 3), (14, 0, 0, 3), (18, 0, 0, 3)]
    """
    out: list[tuple[int, int, int, int]] = []
    for level in LEVELS[1:]:
        shift, k = level - LEVELS[0], 0
        while k < len(fine):
            block, m = fine[k] >> shift, k + 1
            while m < len(fine) and fine[m] >> shift == block:
                m += 1
            out.append((level, block, k, m))
            k = m
    return out


def level_for(width: int) -> int | None:
    """The coarsest stored level whose blocks tile buckets of ``width`` (a power of
    two) steps; None when buckets are finer than every level (read the rows)."""
    fitting = [level for level in LEVELS if 1 << level <= width]
    return fitting[-1] if fitting else None


def cover(lo: int, hi: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Steps ``lo..hi`` as whole rollup blocks ``(level, first block, last block)``,
    coarsest first, and the step ranges at the ends that no block fits.

    >>> cover(10, 2000)
    ([(6, 1, 30)], [(10, 63), (1984, 2000)])
    """
    blocks: list[tuple[int, int, int]] = []
    rest: list[tuple[int, int]] = []
    pending = [(lo, hi, len(LEVELS) - 1)]
    while pending:
        a, b, i = pending.pop()
        if a > b:
            continue
        if i < 0:
            rest.append((a, b))
            continue
        size = 1 << LEVELS[i]
        first, last = -(-a // size), (b + 1) // size - 1
        if first > last:
            pending.append((a, b, i - 1))
            continue
        blocks.append((LEVELS[i], first, last))
        pending.append(((last + 1) * size, b, i - 1))
        pending.append((a, first * size - 1, i - 1))
    return blocks, rest
