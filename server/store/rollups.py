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
from collections.abc import Callable, Iterable
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


def _merge(
    into: list[Any], lo_step: int, lo: Any, lo_key: Any, hi_step: int, hi: Any, hi_key: Any
) -> None:
    if lo_key < into[4] or (lo_key == into[4] and lo_step < into[0]):
        into[0], into[1], into[4] = lo_step, lo, lo_key
    if hi_key > into[5] or (hi_key == into[5] and hi_step < into[2]):
        into[2], into[3], into[5] = hi_step, hi, hi_key


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


def merge_buckets(
    found: Iterable[tuple[int, int, Any, int, Any]], shift: int, key: Key
) -> dict[int, tuple[Any, ...]]:
    """Rollup rows ``(block, min_step, min_v, max_step, max_v)`` merged into buckets of
    ``2**shift`` blocks: bucket -> ``(min_step, min_v, max_step, max_v)``."""
    found = list(found)
    try:
        # Plain numbers (no NaN, no "NaN" string) compare as they are: no key per value.
        total = sum(r[2] for r in found) + sum(r[4] for r in found)
        plain = total == total
    except TypeError:
        plain = False
    if plain:
        merged: dict[int, list[Any]] = {}
        for block, lo_step, lo, hi_step, hi in found:
            b = merged.get(block >> shift)
            if b is None:
                merged[block >> shift] = [lo_step, lo, hi_step, hi]
                continue
            if lo < b[1] or (lo == b[1] and lo_step < b[0]):
                b[0], b[1] = lo_step, lo
            if hi > b[3] or (hi == b[3] and hi_step < b[2]):
                b[2], b[3] = hi_step, hi
        return {at: tuple(b) for at, b in merged.items()}
    buckets: dict[int, list[Any]] = {}
    for block, lo_step, lo, hi_step, hi in found:
        at = block >> shift
        b = buckets.get(at)
        if b is None:
            buckets[at] = [lo_step, lo, hi_step, hi, key(lo), key(hi)]
        else:
            _merge(b, lo_step, lo, key(lo), hi_step, hi, key(hi))
    return {at: tuple(b[:4]) for at, b in buckets.items()}
