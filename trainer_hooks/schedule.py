"""Which steps capture the heavy quantities: every N-th, stretched to fit a budget.

Cheap fields (step time, loss, memory, overhead) are in every step record. Heavy
quantities (gradient norms, per-timestep norms, the graph walk, profiling) are
captured on the steps this schedule picks: every ``every``-th step, and, with an
overhead budget, less often when gradwatch's own time would exceed that fraction of
the training time.

The budget rule: with ``h`` the overhead fraction of a heavy step and ``c`` that of a
cheap one (running means), capturing every ``n``-th step costs about
``(h + (n - 1) * c) / n``. The interval is the smallest ``n >= every`` that keeps this
within the budget, capped at ``max_interval``.

Example:
    >>> s = Schedule(every=2)
    >>> [s.capture(step) for step in range(5)]
    [True, False, True, False, True]
"""

from __future__ import annotations

import math


class Schedule:
    """Decides per step whether heavy quantities are captured.

    Args:
        every: capture heavy quantities every ``every`` steps (1 = every step).
        overhead: optional budget, a fraction of step time (``0.02`` = 2 %).
        max_interval: the budget never stretches the interval beyond this
            (default: 1000, or ``every`` when larger).

    Example:
        >>> s = Schedule(every=1, overhead=0.05)
        >>> s.observe(step=0, heavy=True, fraction=0.20)
        >>> s.observe(step=1, heavy=False, fraction=0.0)
        >>> s.interval
        4
    """

    #: weight of the newest observation in the running means
    SMOOTHING = 0.2

    def __init__(
        self, every: int = 1, overhead: float | None = None, max_interval: int | None = None
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"expected every= to be an integer >= 1, got {every!r}")
        if overhead is not None and (
            isinstance(overhead, bool)
            or not isinstance(overhead, (int, float))
            or not 0.0 < overhead < 1.0
        ):
            raise ValueError(
                "expected overhead= to be a fraction between 0 and 1 (such as 0.02), "
                f"got {overhead!r}"
            )
        if max_interval is None:
            max_interval = max(1000, every)
        if max_interval < every:
            raise ValueError(f"expected max_interval >= every ({every}), got {max_interval!r}")
        self.every = every
        self.budget = None if overhead is None else float(overhead)
        self.max_interval = max_interval
        self.interval = every
        self._next = 0
        self._last_heavy = 0
        self._heavy_mean: float | None = None
        self._cheap_mean = 0.0

    def capture(self, step: int) -> bool:
        """True when ``step`` is a heavy step; call once per step, in order."""
        if step >= self._next:
            self._last_heavy = step
            self._next = step + self.interval
            return True
        return False

    def observe(self, step: int, heavy: bool, fraction: float) -> None:
        """Feed the measured overhead fraction of a finished step."""
        if self.budget is None or not math.isfinite(fraction):
            return
        a = self.SMOOTHING
        if heavy:
            self._heavy_mean = fraction if self._heavy_mean is None else (
                (1 - a) * self._heavy_mean + a * fraction
            )
        else:
            self._cheap_mean = (1 - a) * self._cheap_mean + a * fraction
        if heavy:
            self._last_heavy = step
        self.interval = self._fit()
        # The interval counts from the last heavy step, whether it grew or shrank.
        self._next = self._last_heavy + self.interval

    def _fit(self) -> int:
        assert self.budget is not None
        if self._heavy_mean is None or self._heavy_mean <= self.budget:
            return self.every
        spare = self.budget - self._cheap_mean
        if spare <= 0:
            return self.max_interval
        # the tolerance keeps 0.10 / 0.02 = 5.000000000000001 from becoming 6
        n = math.ceil((self._heavy_mean - self._cheap_mean) / spare - 1e-9)
        return max(self.every, min(self.max_interval, n))
