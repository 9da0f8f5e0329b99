"""The Theil–Sen trend of a sliding window, kept up to date one point at a time.

:func:`~.base.trend` recomputes every pairwise slope of its window: O(n²) slopes and
an O(n² log n) sort, on every record (the ``slowdown`` window of 30 steps: 435 slopes,
~250 µs a record on the Monitor's background thread, which shares the CPU with
training). :class:`SlidingTrend` keeps two things instead:

- the rising fraction, always: a new point adds its n-1 pairs to a count of pairs
  and of rising pairs, the point that leaves takes its n-1 out. A detector that needs
  a rising fraction first (``slowdown``) asks :meth:`rising` and most records end
  there: noise rises in half the pairs, far below what it needs. In the usual case
  (x is a step number that only grows, y an ordinary number) a pair with the newer
  point rises exactly when the newer y is larger, so the counts come from the
  window's y values kept sorted (``bisect``: ~1 µs a point instead of ~5 µs of
  divisions); otherwise the n-1 slopes are computed;
- the window's slopes in a sorted list, only while someone asks for the slope:
  :meth:`trend` builds it (O(n² log n), once), then each point adds its n-1 slopes and
  the leaving point takes its n-1 out (``bisect``) until :meth:`release` drops it.

It returns exactly what :func:`~.base.trend` returns on the same window: every slope
is computed by the same expression from the same two points (so the same float and
the same sign), the sorted list holds the same multiset, and the median, the rising
fraction and the intercept are read the same way. A non-finite value in the window (a
NaN slope cannot be ordered) makes it fall back to :func:`~.base.trend` until that
point has left the window.

Example:
    >>> t = SlidingTrend(window=5)
    >>> for step, seconds in enumerate([9.0, 1.0, 2.0, 3.0, 4.0, 50.0]):
    ...     t.push(float(step), seconds)
    >>> t.rising()  # steps 1-5: every pair rises
    1.0
    >>> t.trend()  # (slope, value at step 5, rising fraction); one outlier
    (1.0, 5.0, 1.0)
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque

from .base import median, pairwise_slopes, trend


class SlidingTrend:
    """Theil–Sen slope, fitted last value and rising fraction of the last ``window`` points.

    ``push(x, y)`` adds a point (the oldest leaves once ``window`` are held);
    ``trend()`` equals ``base.trend(xs, ys)`` over the points held, in push order, and
    ``rising()`` its third value.
    """

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"expected a trend window >= 0, got {window!r}")
        self.window = window
        self.xs: deque[float] = deque()
        self.ys: deque[float] = deque()
        #: every pairwise slope of the window, sorted, while kept (see :meth:`trend`)
        self._slopes: list[float] | None = None
        self._pairs = 0  # pairs with distinct x
        self._up = 0  # of which the slope is > 0
        self._bad = 0  # points in the window with a non-finite x or y
        # the window's y values sorted, while every pair's sign is the sign of its y
        # difference (_ordinary); pushes left before it can be rebuilt otherwise
        self._ys_sorted: list[float] | None = []
        self._irregular = 0

    def __len__(self) -> int:
        return len(self.xs)

    def push(self, x: float, y: float) -> None:
        """Add the point ``(x, y)``; the oldest point leaves when the window is full."""
        xs, ys = self.xs, self.ys
        if self.window == 0:  # holds nothing, as deque(maxlen=0)
            return
        ordered = self._ys_sorted
        if not (_ordinary(x, y) and (not xs or x > xs[-1])):
            ordered = self._ys_sorted = None
            self._irregular = self.window + 1  # until this point has left the window
        if len(xs) == self.window:
            x0, y0 = xs.popleft(), ys.popleft()
            if not (math.isfinite(x0) and math.isfinite(y0)):
                self._bad -= 1
                if self._bad == 0:
                    self._recount()
            elif self._bad == 0:
                if ordered is not None and self._slopes is None:
                    # x only grows: (yj - y0) / (xj - x0) > 0 exactly when yj > y0
                    del ordered[bisect_left(ordered, y0)]
                    self._pairs -= len(ordered)
                    self._up -= len(ordered) - bisect_right(ordered, y0)
                else:
                    self._leave(x0, y0)
        if not (math.isfinite(x) and math.isfinite(y)):
            self._bad += 1
            self._slopes = None
        elif self._bad == 0:
            if ordered is not None and self._slopes is None:
                self._pairs += len(ordered)
                self._up += bisect_left(ordered, y)
            else:
                self._enter(x, y)
        if ordered is not None:
            insort(ordered, y)
        xs.append(x)
        ys.append(y)
        if self._irregular:
            self._irregular -= 1
            if self._irregular == 0:
                self._ys_sorted = sorted(ys)

    def _leave(self, x0: float, y0: float) -> None:
        """Take the leaving point's pairs out of the counts (and the sorted slopes)."""
        # the same expression as base.pairwise_slopes (the older point first)
        gone = [(yj - y0) / (xj - x0) for xj, yj in zip(self.xs, self.ys, strict=True) if xj != x0]
        self._pairs -= len(gone)
        self._up -= sum(1 for g in gone if g > 0)
        slopes = self._slopes
        if slopes is not None:
            for g in gone:
                del slopes[bisect_left(slopes, g)]
        if self._ys_sorted is not None:
            del self._ys_sorted[bisect_left(self._ys_sorted, y0)]

    def _enter(self, x: float, y: float) -> None:
        """Add the new point's pairs to the counts (and the sorted slopes)."""
        new = [(y - yi) / (x - xi) for xi, yi in zip(self.xs, self.ys, strict=True) if x != xi]
        self._pairs += len(new)
        self._up += sum(1 for s in new if s > 0)
        slopes = self._slopes
        if slopes is not None:
            slopes += new  # appended, then one sort: timsort merges the two runs in C
            slopes.sort()

    def _recount(self) -> None:
        """The counts from scratch (the last non-finite point just left the window)."""
        new = pairwise_slopes(list(self.xs), list(self.ys))
        self._pairs = len(new)
        self._up = sum(1 for s in new if s > 0)
        self._slopes = None
        if self._ys_sorted is not None:
            self._ys_sorted = sorted(self.ys)

    def rising(self) -> float:
        """The fraction of pairs that rise (``trend()[2]``), without the slopes' sort."""
        if self._bad:
            return trend(list(self.xs), list(self.ys))[2] if self.xs else 0.0
        return self._up / self._pairs if self._pairs else 0.0

    def release(self) -> None:
        """Stop keeping the sorted slopes (until :meth:`trend` is asked again)."""
        self._slopes = None

    def trend(self) -> tuple[float, float, float]:
        """(Theil–Sen slope, the trend line's value at the last x, rising fraction)."""
        xs, ys = self.xs, self.ys
        if self._bad or not xs:
            return trend(list(xs), list(ys))
        slopes = self._slopes
        if slopes is None:
            slopes = self._slopes = sorted(pairwise_slopes(list(xs), list(ys)))
        n = len(slopes)
        if n == 0:
            return 0.0, ys[-1], 0.0
        mid = n // 2
        slope = slopes[mid] if n % 2 else (slopes[mid - 1] + slopes[mid]) / 2.0
        rising = (n - bisect_right(slopes, 0.0)) / n
        intercept = median([y - slope * x for x, y in zip(xs, ys, strict=True)])
        return slope, intercept + slope * xs[-1], rising


#: |x| up to this keeps every x difference finite and at most 2**1001
_X_LIMIT = 2.0**1000
#: |y| of 0 or at least this keeps every nonzero y difference >= 2**-1012, so that
#: dividing it by an x difference (at most 2**1001) never rounds it to zero
_Y_FLOOR = 2.0**-960


def _ordinary(x: float, y: float) -> bool:
    """Whether the sign of a slope to or from this point is the sign of the y
    difference (given x only grows): finite, x not huge, y zero or not tiny."""
    return abs(x) <= _X_LIMIT and (y == 0.0 or _Y_FLOOR <= abs(y) < math.inf)
