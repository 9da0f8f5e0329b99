"""Which steps capture the heavy quantities: every N-th, stretched to fit a budget.

Cheap fields (step time, loss, memory, overhead) are in every step record. Heavy
quantities (gradient norms, per-timestep norms, the graph walk, profiling) are
captured on the steps this schedule picks: every ``every``-th step, and, with an
overhead budget, less often when gradwatch's own time would exceed that fraction of
the training time.

The budget rule: with ``h`` the overhead fraction of a heavy step and ``c`` that of a
cheap one, capturing every ``n``-th step costs about ``(h + (n - 1) * c) / n``. The
interval is the smallest ``n >= every`` that keeps this within the budget, capped at
``max_interval``.

What ``h`` and ``c`` count: gradwatch's own time on the training thread (hooks and
``step()``, timed where they run: the record's ``overhead``), the background thread's
CPU time per record, and, for heavy steps, the slowdown their hooks cause that no
timer around gradwatch's code can see (``retain_grad`` in backward, the hooked call
path of each module call, the GIL handed to the background thread). That last part
is measured, not guessed: the training's own time between two ``step()`` calls, less
the hooks' timed cost, of each heavy step minus that of the light step just before
it (the median of the last ``WINDOW`` such pairs; pairs of neighbours, so that a box
whose speed drifts over minutes does not bias the difference). With a budget and no
light step for ``PROBE_AFTER`` steps (``every=1`` and a budget that fits), one step
is left light to compare against.

Example:
    >>> s = Schedule(every=2)
    >>> [s.capture(step) for step in range(5)]
    [True, False, True, False, True]
"""

from __future__ import annotations

import math
import statistics
from collections import deque


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
    #: recent (light, heavy) pairs of neighbouring steps whose training time is compared
    WINDOW = 31
    #: fewest pairs before the comparison counts
    MIN_SAMPLES = 5
    #: with a budget, a light step at least this often (something to compare against)
    PROBE_AFTER = 64

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
        self._duration: float | None = None
        self._last_light = -1
        self._extra: deque[float] = deque(maxlen=self.WINDOW)
        self._light_before: tuple[int, float] | None = None  # (step, training seconds)
        self._background = {True: 0.0, False: 0.0}

    def capture(self, step: int) -> bool:
        """True when ``step`` is a heavy step; call once per step, in order."""
        if step >= self._next:
            if self.budget is not None and step - self._last_light > self.PROBE_AFTER:
                self._last_light = step  # a probe: light now, heavy at the next step
                return False
            self._last_heavy = step
            self._next = step + self.interval
            return True
        return False

    def observe(
        self,
        step: int,
        heavy: bool,
        fraction: float,
        duration_s: float | None = None,
        training_s: float | None = None,
        background_s: float | None = None,
    ) -> None:
        """Feed a finished step: ``fraction`` is its timed overhead (the record's
        ``overhead``), ``duration_s`` its length, ``training_s`` the training's own
        time in it (between two ``step()`` calls, less the hooks' timed cost), and
        ``background_s`` the background thread's recent CPU time per record of this
        kind (heavy or light)."""
        if self.budget is None or not math.isfinite(fraction):
            return
        a = self.SMOOTHING
        if heavy:
            self._heavy_mean = fraction if self._heavy_mean is None else (
                (1 - a) * self._heavy_mean + a * fraction
            )
            self._last_heavy = step
        else:
            self._cheap_mean = (1 - a) * self._cheap_mean + a * fraction
            self._last_light = step
        if duration_s is not None and math.isfinite(duration_s) and duration_s > 0:
            self._duration = duration_s if self._duration is None else (
                (1 - a) * self._duration + a * duration_s
            )
        if training_s is not None and math.isfinite(training_s):
            before = self._light_before
            if not heavy:
                self._light_before = (step, training_s)
            elif before is not None and before[0] == step - 1:
                self._extra.append(training_s - before[1])
        if background_s is not None and math.isfinite(background_s):
            self._background[heavy] = max(background_s, 0.0)
        self.interval = self._fit()
        # The interval counts from the last heavy step, whether it grew or shrank.
        self._next = self._last_heavy + self.interval

    def estimate(self) -> tuple[float | None, float]:
        """The overhead fractions ``(h, c)`` of a heavy and a light step that the
        budget works with (``h`` is None before the first heavy step).

        Example:
            >>> s = Schedule(every=1, overhead=0.05)
            >>> s.observe(step=0, heavy=True, fraction=0.04, duration_s=0.01,
            ...           background_s=0.002)
            >>> [round(f, 3) for f in s.estimate() if f is not None]
            [0.24, 0.0]
        """
        if self._heavy_mean is None:
            return None, self._cheap_mean
        step_s = self._duration
        if not step_s:
            return self._heavy_mean, self._cheap_mean
        heavy = self._heavy_mean + (self._hidden() + self._background[True]) / step_s
        light = self._cheap_mean + self._background[False] / step_s
        return heavy, light

    def _hidden(self) -> float:
        """Seconds a heavy step's training takes beyond a light one's (0 when unknown)."""
        if len(self._extra) < self.MIN_SAMPLES:
            return 0.0
        return max(0.0, statistics.median(self._extra))

    def _fit(self) -> int:
        assert self.budget is not None
        heavy, light = self.estimate()
        if heavy is None or heavy <= self.budget:
            return self.every
        spare = self.budget - light
        if spare <= 0:
            return self.max_interval
        # the tolerance keeps 0.10 / 0.02 = 5.000000000000001 from becoming 6
        n = math.ceil((heavy - light) / spare - 1e-9)
        return max(self.every, min(self.max_interval, n))
