"""Which steps capture the heavy quantities: every N-th, or as often as a budget allows.

Cheap fields (step time, loss, memory, overhead) are in every step record. Heavy
quantities (gradient norms, per-timestep norms, the graph walk, profiling) are
captured on the steps this schedule picks: every ``every``-th step, or, with an
overhead budget (``watch()``'s default: :data:`DEFAULT_BUDGET`), as often as keeps
gradwatch's cost within that fraction of the step time.

The budget works in seconds, from what heavy capture is measured to cost, never from
a running mean of noisy step times. Per step it is told the step's span (wall time
from one ``step()`` record to the next: training, hooks and ``step()`` itself), the
part of it gradwatch's own timers saw (hooks and ``step()``) and the background
thread's CPU per record. From these it keeps medians over the last ``WINDOW``
observations:

- ``H``, what a heavy step costs beyond a light one: the span of the heavy step and
  of the light step after it (which pays for what the heavy step leaves: freeing its
  kept gradients, taking hooks off) minus twice the span of the light step before
  it, itself after a light step (neighbours, so that a box whose speed drifts over
  minutes does not bias it; a median, so that a step another process interrupted
  does not either), at least the difference of the timed parts (steadier where
  steps are long and noisy), plus the background thread's extra CPU for a heavy
  record. This counts what no timer around gradwatch's code sees: ``retain_grad``
  and hooks in backward, the hooked call path of each module call, allocations;
- ``c``, what a light step costs: its timed part and the background thread's CPU
  for a light record;
- ``T``, the span of a light step.

Capturing every ``n``-th step costs ``H / n + c`` a step; the interval is the
smallest ``n >= every`` with ``H / n + c <= budget * T``; where light steps leave
less than :attr:`Schedule.HEAVY_FLOOR` (0.5 %) of the step, heavy capture takes that
much (``H / n <= 0.005 * T``) rather than stopping, so the total then exceeds the
budget by at most that share. A loaded box stretches ``T`` and ``H`` alike, so the
interval does not swing with the load. Until ``MIN_SAMPLES`` pairs have been seen,
every third step is heavy (steps 0, 3, 6, ...: calibration). With no light step for
``PROBE_AFTER`` steps without a pair to compare (an interval of 1 or 2 leaves no
light step after a light one), a probe leaves two steps light, then one heavy, then
one light. Without a budget nothing is left out: the costs are measured where light
steps come anyway (``every=N``, N >= 3) for the records' ``overhead``.

Example:
    >>> s = Schedule(every=2)
    >>> [s.capture(step) for step in range(5)]
    [True, False, True, False, True]
"""

from __future__ import annotations

import math
import statistics
from collections import deque

#: the budget ``watch()`` uses when given neither ``every=`` nor ``overhead=``: 2 %
#: leaves room for the estimate's error under 3 % where the light step is cheap; on
#: steps of a few ms the light step alone exceeds it (HEAVY_FLOOR, BENCHMARKS.md)
DEFAULT_BUDGET = 0.02


def _median(values: deque[float]) -> float:
    return statistics.median(values) if values else 0.0


class Schedule:
    """Decides per step whether heavy quantities are captured.

    Args:
        every: capture heavy quantities every ``every`` steps (1 = every step); with
            a budget, the shortest interval it may use.
        overhead: optional budget, a fraction of step time (``0.02`` = 2 %).
        max_interval: the budget never stretches the interval beyond this
            (default: 1000, or ``every`` when larger).

    Example (a heavy step costs 4 ms more than a light one, 0.1 ms, of 10 ms):
        >>> s = Schedule(every=1, overhead=0.05)
        >>> for step in range(40):
        ...     heavy = s.capture(step)
        ...     s.observe(step, heavy, spent_s=0.0001, span_s=0.014 if heavy else 0.010)
        >>> s.interval  # 0.004 / n + 0.0001 <= 0.05 * 0.010  ->  n = 10
        10
    """

    #: recent observations each median is taken over
    WINDOW = 31
    #: fewest heavy/light pairs before the measured cost is used (calibration before)
    MIN_SAMPLES = 5
    #: with a budget, the share of a step heavy capture may always take, even where
    #: light steps alone exceed the budget (0.5 %: a heavy step ~20 % dearer than a
    #: light one then comes every ~40 steps)
    HEAVY_FLOOR = 0.005
    #: with a budget, a light step at least this often (something to compare against)
    PROBE_AFTER = 64
    #: with a budget, the interval is refit at least this often (and after each pair)
    REFIT_EVERY = 16

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
        self.interval = every if self.budget is None else max(every, 3)
        self._next = 0
        self._last_heavy = 0
        self._last_light = -1
        n = self.WINDOW
        self._extra: deque[float] = deque(maxlen=n)  # heavy span - light span before
        self._unseen: deque[float] = deque(maxlen=n)  # the same, less the timed parts
        self._light_span: deque[float] = deque(maxlen=n)
        self._light_spent: deque[float] = deque(maxlen=n)
        self._heavy_spent: deque[float] = deque(maxlen=n)
        # light steps since the last one that followed a heavy step: (span, timed part)
        self._clean: list[tuple[float, float]] = []
        # a heavy step waiting for the step after it: (step, span, timed part, baseline)
        self._pending: tuple[int, float, float, tuple[float, float]] | None = None
        self._previous = -1  # the last step observed
        self._last_pair = 0  # the step a pair was last completed (or a probe began)
        self._light_at: set[int] = set()  # steps a probe keeps light
        self._background = {True: 0.0, False: 0.0}
        self._refit_at = 0

    @property
    def calibrating(self) -> bool:
        """True while the budget has too few heavy/light pairs to go by."""
        return self.budget is not None and len(self._extra) < self.MIN_SAMPLES

    def capture(self, step: int) -> bool:
        """True when ``step`` is a heavy step; call once per step, in order."""
        if step in self._light_at:
            self._light_at.discard(step)
            return False
        if step >= self._next:
            if self.budget is not None and step - self._last_pair > self.PROBE_AFTER:
                # a probe: light, light, heavy (step + 2), light
                self._light_at = {step + 1, step + 3}
                self._last_pair = step  # one probe at a time
                return False
            self._last_heavy = step
            self._next = step + self.interval
            return True
        return False

    def observe(
        self,
        step: int,
        heavy: bool,
        spent_s: float,
        span_s: float | None = None,
        background_s: float | None = None,
    ) -> None:
        """Feed a finished step: ``spent_s`` is what gradwatch's timers saw on the
        training thread (hooks and ``step()``), ``span_s`` the step's wall time from
        the previous record to this one, ``background_s`` the background thread's
        recent CPU per record of this kind (heavy or light). Without a budget the
        costs are measured too (for the records' ``overhead``) but change nothing."""
        if background_s is not None and math.isfinite(background_s):
            self._background[heavy] = max(background_s, 0.0)
        if heavy:
            self._last_heavy = step
        else:
            self._last_light = step
        paired = False
        if span_s is not None and math.isfinite(span_s) and math.isfinite(spent_s):
            paired = self._pair(step, heavy, span_s, spent_s)
        # Refit when a heavy/light pair is complete (what a heavy step costs moved) or
        # every REFIT_EVERY steps (the light steps' share drifts slowly): the medians
        # cost ~20 µs, too much for every light step of a 3 ms training step.
        if self.budget is not None and not self.calibrating and (
            paired or step >= self._refit_at
        ):
            self.interval = self._fit()
            self._refit_at = step + self.REFIT_EVERY
        # The interval counts from the last heavy step, whether it grew or shrank.
        self._next = self._last_heavy + self.interval

    def close(self) -> None:
        """The monitor closed: nothing to release here (an agreed schedule stops)."""

    def _pair(self, step: int, heavy: bool, span: float, spent: float) -> bool:
        """Compare a heavy step and the light one after it with the clean light steps
        before it (light steps after a light step: what a step costs without capture).
        True when this step completed a pair."""
        pending, self._pending = self._pending, None
        contiguous = step == self._previous + 1
        self._previous = step
        if not contiguous:
            self._clean = []
        if heavy:
            self._heavy_spent.append(spent)
            if contiguous and self._clean:
                base = (statistics.median(c[0] for c in self._clean),
                        statistics.median(c[1] for c in self._clean))
                self._pending = (step, span, spent, base)
            self._clean = []
            return False
        self._light_span.append(span)
        self._light_spent.append(spent)
        if pending is None or pending[0] != step - 1:
            if contiguous and step - 1 != self._last_heavy:
                self._clean.append((span, spent))
            return False
        _, heavy_span, heavy_spent, (clean, clean_spent) = pending
        self._last_pair = step
        self._extra.append(heavy_span + span - 2 * clean)
        self._unseen.append(
            (heavy_span - heavy_spent) + (span - spent) - 2 * (clean - clean_spent)
        )
        return True

    def hidden_s(self) -> float:
        """Seconds a heavy step's training takes beyond a light one's that gradwatch's
        timers do not see (0 until measured; never with ``every=1`` and no budget,
        which leaves no light step to compare with)."""
        if len(self._unseen) < self.MIN_SAMPLES:
            return 0.0
        return max(0.0, _median(self._unseen))

    def estimate(self) -> tuple[float | None, float]:
        """The overhead fractions ``(h, c)`` of a heavy and a light step's span that
        the budget works with (``h`` is None until measured).

        Example:
            >>> s = Schedule(every=1, overhead=0.05)
            >>> for step in range(20):
            ...     heavy = s.capture(step)
            ...     s.observe(step, heavy, 0.0002, 0.012 if heavy else 0.010)
            >>> [round(f, 3) for f in s.estimate()]
            [0.2, 0.02]
        """
        span = _median(self._light_span)
        if not span:
            return None, 0.0
        light = _median(self._light_spent) + self._background[False]
        if self.calibrating:
            return None, light / span
        return self.heavy_extra_s() / span, light / span

    def heavy_extra_s(self) -> float:
        """Seconds a heavy step costs beyond a light one: the median of neighbour
        pairs, but at least what the timers saw (steadier where steps are long and
        noisy and pairs are few), plus the background thread's extra CPU for a heavy
        record."""
        timed = _median(self._heavy_spent) - _median(self._light_spent)
        extra = max(0.0, _median(self._extra), timed)
        return extra + max(0.0, self._background[True] - self._background[False])

    def _fit(self) -> int:
        assert self.budget is not None
        heavy, light = self.estimate()
        if heavy is None:
            return self.interval
        # Where light steps alone use (nearly) all of the budget, heavy capture still
        # gets HEAVY_FLOOR of the step: a monitor that never looks at the gradients
        # again after calibration would be cheap and blind
        spare = max(self.budget - light, min(self.budget, self.HEAVY_FLOOR))
        # the tolerance keeps 0.10 / 0.02 = 5.000000000000001 from becoming 6
        n = math.ceil(heavy / spare - 1e-9)
        return max(self.every, min(self.max_interval, n))
