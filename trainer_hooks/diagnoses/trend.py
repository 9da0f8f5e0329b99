"""The Theil–Sen trend of a sliding window, kept up to date one point at a time.

:func:`~.base.trend` recomputes every pairwise slope of its window: O(n²) slopes and
an O(n² log n) sort, on every record (the ``slowdown`` window of 30 steps: 435 slopes,
~250 µs a record on the Monitor's background thread, which shares the CPU with
training). :class:`SlidingTrend` keeps the window's slopes in a sorted list instead:
a new point adds its n-1 slopes and the point that leaves the window takes its n-1
slopes out (``bisect``, O(n) each), so a record costs O(n) list work plus the O(n log n)
intercept.

It returns exactly what :func:`~.base.trend` returns on the same window: every slope
is computed by the same expression from the same two points (so the same float), the
sorted list holds the same multiset, and the median, the rising fraction and the
intercept are read the same way. A non-finite value in the window (a NaN slope
cannot be ordered) makes it fall back to :func:`~.base.trend` until that point has
left the window.

Example:
    >>> t = SlidingTrend(window=5)
    >>> for step, seconds in enumerate([9.0, 1.0, 2.0, 3.0, 4.0, 50.0]):
    ...     t.push(float(step), seconds)
    >>> t.trend()  # steps 1-5 (one outlier): (slope, value at step 5, rising fraction)
    (1.0, 5.0, 1.0)
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque

from .base import median, trend


class SlidingTrend:
    """Theil–Sen slope, fitted last value and rising fraction of the last ``window`` points.

    ``push(x, y)`` adds a point (the oldest leaves once ``window`` are held);
    ``trend()`` equals ``base.trend(xs, ys)`` over the points held, in push order.
    """

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"expected a trend window >= 0, got {window!r}")
        self.window = window
        self.xs: deque[float] = deque()
        self.ys: deque[float] = deque()
        #: every pairwise slope of the window, sorted; None while a non-finite point is in
        self._slopes: list[float] | None = []
        self._bad = 0  # points in the window with a non-finite x or y

    def __len__(self) -> int:
        return len(self.xs)

    def push(self, x: float, y: float) -> None:
        """Add the point ``(x, y)``; the oldest point leaves when the window is full."""
        xs, ys = self.xs, self.ys
        if self.window == 0:  # holds nothing, as deque(maxlen=0)
            return
        if len(xs) == self.window:
            x0, y0 = xs.popleft(), ys.popleft()
            finite0 = math.isfinite(x0) and math.isfinite(y0)
            self._bad -= not finite0
            slopes = self._slopes
            if slopes is not None:
                # the same expression as base.pairwise_slopes (the older point first)
                for xj, yj in zip(xs, ys, strict=True):
                    if xj != x0:
                        del slopes[bisect_left(slopes, (yj - y0) / (xj - x0))]
        finite = math.isfinite(x) and math.isfinite(y)
        slopes = self._slopes
        if slopes is not None and finite:
            # appended, then one sort: timsort merges the two sorted runs in C
            slopes += [(y - yi) / (x - xi) for xi, yi in zip(xs, ys, strict=True) if x != xi]
            slopes.sort()
        xs.append(x)
        ys.append(y)
        if not finite:
            self._bad += 1
            self._slopes = None
        elif self._slopes is None and self._bad == 0:
            self._rebuild()

    def _rebuild(self) -> None:
        xs, ys = list(self.xs), list(self.ys)
        self._slopes = sorted(
            (ys[j] - ys[i]) / (xs[j] - xs[i])
            for i in range(len(xs))
            for j in range(i + 1, len(xs))
            if xs[j] != xs[i]
        )

    def trend(self) -> tuple[float, float, float]:
        """(Theil–Sen slope, the trend line's value at the last x, rising fraction)."""
        xs, ys = self.xs, self.ys
        slopes = self._slopes
        if slopes is None or not xs:
            return trend(list(xs), list(ys))
        n = len(slopes)
        if n == 0:
            return 0.0, ys[-1], 0.0
        mid = n // 2
        slope = slopes[mid] if n % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0
        rising = (n - bisect_right(slopes, 0.0)) / n
        intercept = median([y - slope * x for x, y in zip(xs, ys, strict=True)])
        return slope, intercept + slope * xs[-1], rising
