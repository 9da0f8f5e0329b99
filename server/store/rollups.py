"""Min/max rollups of every scalar series, kept at ingest, so history never scans 1e6 rows.

Each series (a plain field, a named scalar or the step numbers: :data:`STEP_SERIES`)
has an id in ``series``. A chunk (store/chunks.py) brings ~35 series that share their
steps, and keeps ONE row per (set of series, level, block) for them all: a set
(``rollup_sets``, its members in ``rollup_members``) lists its series, all of one
kind (``i`` int64, ``f`` float64); a ``set_rollups`` row, per block of ``2**L`` steps
(``block = step >> L``, ``L`` in :data:`LEVELS`), holds the number of records, their
first and last step, and per series a record of :data:`ROW_DTYPES` (min step, min,
max step, max).

A history bucket of ``2**k`` steps is exactly ``2**(k-L)`` rows of the largest level
``L <= k``. Ties keep the earliest step. Values order as each backend orders its
stored values (:func:`order_keys`). The same block written again is merged with the
stored row by the same rule (:func:`merge_arrays`); SQLite's writer holds the write
lock from the chunk inserts to the commit, PostgreSQL's locks the sets.

Example:
    >>> found, rows = array_blocks(np.array([3, 70, 65]), np.array([[2.5], [1.0], [9.0]]),
    ...                            "sqlite")
    >>> found[1], rows[1].tolist()
    ((6, 1, 2, 65, 70), [(70, 1.0, 65, 9.0)])
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Levels 16x apart: a bucket merges at most 16 rows of the level below it, and a batch
# of 100 steps upserts ~6 rows per series (4 levels), a few % of its insert cost.
LEVELS = (6, 10, 14, 18)
# The series of the step numbers themselves, per (run, rank): its rollups' counts and
# first/last steps answer the history's `total` without counting 1e6 rows.
STEP_SERIES = "step"


def level_blocks(fine: list[int]) -> list[tuple[int, int, int, int]]:
    """The blocks of every level, finest first, as runs of the finest blocks ``fine``
    (ascending block numbers): ``(level, block, first index, last + 1)``.

    >>> level_blocks([0, 16])
    [(6, 0, 0, 1), (6, 16, 1, 2), (10, 0, 0, 1), (10, 1, 1, 2), (14, 0, 0, 2), (18, 0, 0, 2)]
    """
    out: list[tuple[int, int, int, int]] = []
    for level in LEVELS:
        shift, k = level - LEVELS[0], 0
        while k < len(fine):
            block, m = fine[k] >> shift, k + 1
            while m < len(fine) and fine[m] >> shift == block:
                m += 1
            out.append((level, block, k, m))
            k = m
    return out


def cover(
    lo: int, hi: int, i: int = len(LEVELS) - 1
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Steps ``lo..hi`` as whole rollup blocks ``(level, first block, last block)`` of
    ``LEVELS[i]`` and finer, coarsest first, and the step ranges at the ends that no
    block fits.

    >>> cover(10, 2000)
    ([(6, 1, 30)], [(10, 63), (1984, 2000)])
    """
    if lo > hi:
        return [], []
    if i < 0:
        return [], [(lo, hi)]
    size = 1 << LEVELS[i]
    first, last = -(-lo // size), (hi + 1) // size - 1
    if first > last:
        return cover(lo, hi, i - 1)
    left, right = cover(lo, first * size - 1, i - 1), cover((last + 1) * size, hi, i - 1)
    return [(LEVELS[i], first, last), *left[0], *right[0]], left[1] + right[1]


# One series' rows of a level, from block to block, in whichever sets it is.
_OF_SERIES = (
    " FROM rollup_members m JOIN set_rollups r ON r.set_id = m.set_id"
    " WHERE m.series = ? AND r.level = ? AND r.block >= ? AND r.block <= ?"
)
SERIES_ROWS = "SELECT m.position, m.kind, r.block, r.data" + _OF_SERIES
STEP_COUNT = "SELECT SUM(r.n), MIN(r.step_lo), MAX(r.step_hi)" + _OF_SERIES
# A row of a set whose series are all of one kind, as a numpy record per series.
ROW_DTYPES = {
    kind: np.dtype([("ls", "<i8"), ("lv", f"<{kind}8"), ("hs", "<i8"), ("hv", f"<{kind}8")])
    for kind in ("i", "f")
}


# int64 keys of float64 bits: x >= 0 as they are, x < 0 with the other bits flipped.
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_INF = np.int64(0x7FF0_0000_0000_0000)
_NAN = np.int64(0x7FF8_0000_0000_0000)


def order_keys(values: np.ndarray, order: str) -> np.ndarray:
    """int64 keys that order float64 ``values`` as the backend orders stored numbers:
    ``"postgresql"``: -inf < numbers < +inf < NaN (every NaN equal); ``"sqlite"``:
    numbers < "-Infinity" < "Infinity" < "NaN" (text after numbers); -0.0 == 0.0.

    >>> order_keys(np.array([1.0, -2.0, -0.0, np.inf, -np.inf, np.nan]), "sqlite").argsort()
    array([1, 2, 0, 4, 3, 5])
    """
    if values.dtype.kind != "f":
        return values
    bits = (values + 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0
    keys = np.where(bits < 0, bits ^ _FLIP, bits)
    if np.isfinite(values).all():
        return keys
    keys[np.isnan(values)] = _NAN
    if order == "sqlite":  # "-Infinity" and "Infinity" above every number
        keys[values == -np.inf] = _INF
        keys[values == np.inf] = _INF + 1
    return keys


def array_blocks(
    steps: np.ndarray, matrix: np.ndarray, order: str
) -> tuple[list[tuple[int, int, int, int, int]], np.ndarray]:
    """The rollup rows of a group of series of one dtype (``matrix[i, k]``: series k at
    ``steps[i]``): each block's ``(level, block, n, first step, last step)`` of every
    level and, row for row, one record of :data:`ROW_DTYPES` per series. argmin/argmax
    keep the first of equal values, in step order (a stable sort where the steps were
    not): ties keep the earliest step."""
    if steps.size > 1 and bool((steps[1:] < steps[:-1]).any()):
        perm = np.argsort(steps, kind="stable")
        steps, matrix = steps[perm], matrix[perm]
    keys = order_keys(matrix, order)
    blocks = steps >> LEVELS[0]
    cuts = (np.flatnonzero(blocks[1:] != blocks[:-1]) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, int(steps.size)]
    fine = blocks[starts].tolist()
    step_list = steps.tolist()
    columns = np.arange(matrix.shape[1])
    # Index (into steps) of each series' min and max per block: the finest blocks
    # first, then the coarser ones (at most as many as the finest, per level).
    lows = np.empty((len(fine) * len(LEVELS), matrix.shape[1]), np.intp)
    highs = np.empty_like(lows)
    for f, (i, j) in enumerate(zip(starts, ends, strict=True)):
        part = keys[i:j]
        lows[f] = part.argmin(0) + i
        highs[f] = part.argmax(0) + i
    found: list[tuple[int, int, int, int, int]] = []
    for level, block, k, m in level_blocks(fine):
        at = len(found)
        if m - k == 1:  # the finest level's (at == k), or a coarser block of one
            lows[at], highs[at] = lows[k], highs[k]
        else:
            # A coarser block's extremes are among its finest blocks'; the first of
            # equal ones is the earliest step.
            lo, hi = lows[k:m], highs[k:m]
            lows[at] = lo[keys[lo, columns].argmin(0), columns]
            highs[at] = hi[keys[hi, columns].argmax(0), columns]
        first, last = step_list[starts[k]], step_list[ends[m - 1] - 1]
        found.append((level, block, ends[m - 1] - starts[k], first, last))
    lo, hi = lows[: len(found)], highs[: len(found)]
    rows = np.empty(lo.shape, ROW_DTYPES[matrix.dtype.kind])
    rows["ls"], rows["lv"] = steps[lo], matrix[lo, columns]
    rows["hs"], rows["hv"] = steps[hi], matrix[hi, columns]
    return found, rows


def merge_arrays(old: np.ndarray, new: np.ndarray, order: str) -> np.ndarray:
    """Rows as numpy records (elementwise: one row or many), ``new`` written after
    ``old``: the lower value wins, then the earlier step; the higher value, then the
    earlier step (values compared by :func:`order_keys`)."""
    out = old.copy()
    for step, value, better in (("ls", "lv", np.less), ("hs", "hv", np.greater)):
        new_key, old_key = order_keys(new[value], order), order_keys(old[value], order)
        wins = better(new_key, old_key) | ((new_key == old_key) & (new[step] < old[step]))
        out[step][wins], out[value][wins] = new[step][wins], new[value][wins]
    return out


def bucket_extremes(rows: list[tuple[Any, ...]], shift: int, order: str) -> list[tuple[int, Any]]:
    """(step, value) of the min and of the max of each bucket of ``2**shift`` blocks,
    from the :data:`SERIES_ROWS` rows ``(position, kind, block, data)`` of one series
    (in one set or several), as :func:`extremes` picks them."""
    parts: dict[tuple[int, str, int], tuple[list[int], list[bytes]]] = {}
    for at, kind, block, data in rows:
        found = parts.setdefault((at, kind, len(data)), ([], []))
        found[0].append(block)
        found[1].append(bytes(data))
    if not parts:
        return []
    blocks = np.concatenate([np.array(b, np.int64) for b, _ in parts.values()])
    records = [
        np.frombuffer(b"".join(data), ROW_DTYPES[kind]).reshape(len(data), -1)[:, at]
        for (at, kind, _), (_, data) in parts.items()
    ]
    return extremes(blocks >> shift, np.concatenate(records), order)


def extremes(buckets: np.ndarray, records: np.ndarray, order: str) -> list[tuple[int, Any]]:
    """(step, value) of the min and of the max of each bucket (``buckets``: each record's)
    from ``records`` of :data:`ROW_DTYPES`: the lower (higher) value in the backend's
    ``order``, then the earlier step, then the earlier record; in O(n) numpy passes
    (a lexsort of 30,000 records cost 3x as much)."""
    if not len(records):
        return []
    if (np.diff(buckets) < 0).any():  # chunks' points come in order; rollup rows need not
        perm = np.argsort(buckets, kind="stable")
        buckets, records = buckets[perm], records[perm]
    starts = np.flatnonzero(np.diff(buckets, prepend=buckets[0] - 1))
    sizes = np.diff(starts, append=len(buckets))
    out: list[tuple[int, Any]] = []
    for step, value, best in (("ls", "lv", np.minimum), ("hs", "hv", np.maximum)):
        keys, steps = order_keys(records[value], order), records[step]
        # Each bucket's rows of the best value, of those the earliest step's, the first.
        tied = keys == np.repeat(best.reduceat(keys, starts), sizes)
        if (np.diff(steps) < 0).any():  # else the first tied row is the earliest step
            early = np.where(tied, steps, np.iinfo(np.int64).max)
            tied &= steps == np.repeat(np.minimum.reduceat(early, starts), sizes)
        rows = np.flatnonzero(tied)
        first = rows[np.searchsorted(rows, starts)]
        out.extend(zip(steps[first].tolist(), records[value][first].tolist(), strict=True))
    return out
