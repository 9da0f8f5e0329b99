"""Min/max downsampling of one scalar series, so that a 1e6-step run draws at once.

Steps are split into equal-count buckets; each bucket contributes the point with its
smallest and the point with its largest value, in step order, so spikes survive at
any zoom. Non-finite values (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` strings) rank
above every number, so a bucket with a NaN always shows it.

Example:
    >>> minmax([0, 1, 2, 3, 4, 5], [5.0, 1.0, 9.0, 2.0, "NaN", 3.0], max_points=4)
    ([1, 2, 3, 4], [1.0, 9.0, 2.0, 'NaN'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_RANK = {"NaN": float("inf"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _sort_keys(values: Sequence[Any]) -> Sequence[float]:
    """Comparable keys; non-finite strings become infinities (NaN ranks as +inf)."""
    if not any(isinstance(v, str) for v in values):
        return values
    return [_RANK.get(v, float("inf")) if isinstance(v, str) else v for v in values]


def minmax(
    steps: Sequence[int], values: Sequence[Any], max_points: int
) -> tuple[list[int], list[Any]]:
    """At most ``max_points`` points of ``(steps, values)``: each bucket's min and max."""
    if max_points < 2:
        raise ValueError(f"max_points: expected at least 2, got {max_points}")
    n = len(steps)
    if len(values) != n:
        raise ValueError(f"expected as many values as steps, got {len(values)} and {n}")
    if n <= max_points:
        return list(steps), list(values)
    keys = _sort_keys(values)
    buckets = max_points // 2
    out_steps: list[int] = []
    out_values: list[Any] = []
    get = keys.__getitem__
    for b in range(buckets):
        lo = b * n // buckets
        hi = (b + 1) * n // buckets
        span = range(lo, hi)
        i_min = min(span, key=get)
        i_max = max(span, key=get)
        for i in sorted({i_min, i_max}):
            out_steps.append(steps[i])
            out_values.append(values[i])
    return out_steps, out_values


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
