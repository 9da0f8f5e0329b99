"""Min/max downsampling of one scalar series, so that a 1e6-step run draws at once.

Steps are split into aligned buckets of a power-of-two width (bucket = ``step // width``,
see :func:`bucket_width`); each bucket contributes the point with its smallest and the
point with its largest value, in step order, so spikes survive at any zoom. Aligned
power-of-two buckets are what the stores' rollups tile exactly (store/rollups.py).
Non-finite values (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` strings) rank above every
number, so a bucket with a NaN always shows it. The stores do the same from their
rollups and from chunks (:func:`gradwatch.server.store.rollups.extremes`); this
is the reference.

Example:
    >>> minmax([0, 1, 2, 3, 4, 5], [5.0, 1.0, 9.0, 2.0, "NaN", 3.0], max_points=4)
    ([1, 2, 4, 5], [1.0, 9.0, 'NaN', 3.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _key(value: Any) -> tuple[int, float]:
    # Non-finite strings rank above every number (as SQLite orders text after numbers).
    return (1, 0.0) if isinstance(value, str) else (0, value)


def minmax(
    steps: Sequence[int], values: Sequence[Any], max_points: int
) -> tuple[list[int], list[Any]]:
    """At most ``max_points`` points of ``(steps, values)``: each bucket's min and max.

    ``steps`` ascending. Buckets are ``step // width`` for the :func:`bucket_width` of
    the first and last step, the same buckets the stores compute (this is their
    reference); ties keep the earliest step.
    """
    if max_points < 2:
        raise ValueError(f"max_points: expected at least 2, got {max_points}")
    n = len(steps)
    if len(values) != n:
        raise ValueError(f"expected as many values as steps, got {len(values)} and {n}")
    if n <= max_points:
        return list(steps), list(values)
    width = bucket_width(steps[0], steps[-1], max_points // 2)
    extremes: dict[int, tuple[int, int]] = {}
    for i, step in enumerate(steps):
        b = step // width
        if b not in extremes:
            extremes[b] = (i, i)
            continue
        lo, hi = extremes[b]
        key = _key(values[i])
        extremes[b] = (i if key < _key(values[lo]) else lo, i if key > _key(values[hi]) else hi)
    chosen = sorted({i for pair in extremes.values() for i in pair})
    return [steps[i] for i in chosen], [values[i] for i in chosen]


def bucket_width(first: int, last: int, buckets: int) -> int:
    """The smallest power of two ``w`` with at most ``buckets`` buckets ``step // w``
    between ``first`` and ``last``.

    >>> bucket_width(0, 999_999, 1000)
    1024
    >>> bucket_width(9, 14, 1)
    8
    """
    if buckets < 1:
        raise ValueError(f"buckets: expected at least 1, got {buckets}")
    width = 1
    while last // width - first // width + 1 > buckets:
        width *= 2
    return width


def pick_rows(n: int, k: int) -> list[int]:
    """``k`` indices of ``range(n)`` spread evenly, always keeping the first and last.

    >>> pick_rows(10, 3)
    [0, 4, 9]
    """
    if k <= 0 or n <= 0:
        return []
    if n <= k:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
