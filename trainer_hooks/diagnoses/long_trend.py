"""The step time's trend over epochs: ``slowdown``'s second look.

``slowdown``'s window is 30 steps. A slowdown that adds little per step beside the
step-time jitter never shows in 30 steps, however far it goes: a CNN whose steps grew
steadily from 2.6 to 7.3 ms over 2,000 steps (a list that grew every step) raised
nothing, and a 10x slowdown that bursts of slow steps cleared was never raised
again. :class:`StepTimeLows` looks at the same step times epoch by epoch: "every
epoch slower than the last".

Each epoch (``Monitor.epoch()``; epochs of fewer than ``min_block`` steps are joined
to the next) becomes one number, its low: the fastest tenth of its steps
(``LOW_QUANTILE``; in chunks of ``CHUNK`` steps, the median of the chunks' lows).
Work that grows with time makes every step slower, the fastest included; a burst of
load from other processes, an evaluation or a checkpoint make some steps slower and
leave the fastest as they were. Where steps are short beside the scheduler's time
slice (a few ms), another process sharing the core leaves the low where it was
altogether (on recorded runs its median doubled, its low moved 2 %). Whole epochs,
not blocks of a fixed length: batches sorted by length make steps slower all through
an epoch and fast again at the next, which fixed blocks read as a slowdown (it was
raised and cleared once an epoch) and epochs see as the same epoch again. A run that
never calls ``epoch()`` gets no second look.

The last ``blocks`` epochs are judged (from ``MIN_BLOCKS`` on), and the last
``2 x blocks`` and ``4 x blocks`` in pairs and fours (means). A horizon holds when, on
its lows, the Theil–Sen trend puts the newest epoch at ``ratio`` times the run's
start (the fastest of its first ``BASE_BLOCKS`` epochs: a first epoch that decodes and
caches its data is slower than the rest) or slower, at least ``rising`` of the pairs
got slower, the trend grew ``growth`` times over the horizon itself, its rise is
``noise`` times the lows' jitter about the trend line, each half of five or more
epochs rises on its own (``HALF_RISING``), and each half's slope is at least ``even``
times the other's and the whole's: a level shift when a run starts sharing its core
(the low doubles at once, or over a few epochs as the other process starts its work)
is steep in one half and flat in the other, or flat in both. Once raised, the rising
fraction and the ratio less ``HYSTERESIS`` keep it, with every other test: a
slowdown that stopped clears within a horizon.

Example:
    >>> lows = StepTimeLows(min_block=10, blocks=6, ratio=1.5, rising=0.8, growth=1.2,
    ...                     noise=3.0, even=0.33)
    >>> for epoch in range(8):  # each epoch 20 % slower, its steps noisy
    ...     for s in range(50):
    ...         lows.push(float(50 * epoch + s), 1e-3 * 1.2 ** epoch * (1 + (s % 3)))
    ...     closed = lows.epoch_ended()
    >>> seen = lows.judge(raised=False)
    >>> round(seen.last / seen.base, 1), len(seen.xs)  # the six epochs after the first two
    (3.4, 6)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .base import HYSTERESIS, median, theil_sen, trend

#: an epoch's low: this quantile of its step times (the 3rd-fastest of 30)
LOW_QUANTILE = 0.1
#: longer epochs are taken in chunks of this many steps (their lows' median): memory
#: and sorting stay bounded however long an epoch is
CHUNK = 256
#: each horizon judges ``blocks`` points: single epochs, then pairs, then fours
SCALES = (1, 2, 4)
#: once raised, only the first this many scales keep it: means of four epochs leave
#: so little jitter that a level slowly drifting after a slowdown stopped passes
HOLD_SCALES = 2
#: the fewest epochs judged for a new slowdown (a horizon of fewer than ``blocks``
#: while they come); a raised one is judged from ``BASE_BLOCKS`` on
MIN_BLOCKS = 6
#: the run's start is the fastest of its first this many epochs
BASE_BLOCKS = 3
#: the rising fraction each half of five or more points needs on its own (noise:
#: 0.5 ± 0.13)
HALF_RISING = 0.7
#: a horizon is judged only when one of the three newest lows is at least this share
#: of the ratio (less ``HYSTERESIS``) times the start
RECENT_SHARE = 0.8


@dataclass(frozen=True)
class LongTrend:
    """A horizon that holds: its points (step, low seconds) and their trend."""

    xs: list[float]
    ys: list[float]
    slope: float
    last: float
    rising: float
    jitter: float
    #: the run's starting speed the ratio is measured against (see the module)
    base: float
    #: the last step of the epoch that set it
    base_end: float


def _rising(ys: list[float]) -> float:
    """The rising fraction of points at increasing x: a count, no slopes."""
    n = len(ys)
    up = sum(1 for i in range(n) for j in range(i + 1, n) if ys[j] > ys[i])
    return up / (n * (n - 1) / 2) if n > 1 else 0.0


def _low(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[int(LOW_QUANTILE * (len(ordered) - 1))]


class StepTimeLows:
    """Epoch lows of the step time and the trend of the last ones (module docstring)."""

    def __init__(
        self,
        min_block: int,
        blocks: int,
        ratio: float,
        rising: float,
        growth: float,
        noise: float,
        even: float,
    ) -> None:
        if min_block < 1 or blocks < MIN_BLOCKS:
            raise ValueError(
                f"expected min_block >= 1 and blocks >= {MIN_BLOCKS}, got {min_block}, {blocks}"
            )
        self.min_block, self.blocks = min_block, blocks
        self.ratio, self.rising, self.growth = ratio, rising, growth
        self.noise, self.even = noise, even
        self._open: list[float] = []  # the open epoch's steps not yet in a chunk
        self._chunks: list[float] = []  # and its chunks' lows
        self._count = 0  # steps in the open epoch
        self._first_step = 0.0
        self._last_step = 0.0
        self._lows: deque[tuple[float, float]] = deque(maxlen=blocks * SCALES[-1])
        self._early: list[float] = []
        self.base: float | None = None
        self.base_end = 0.0
        self._base_index = 0  # the base epoch's number among the closed ones
        self._closed = 0  # epochs closed so far

    def push(self, step: float, seconds: float) -> None:
        """Add one step's time to the open epoch."""
        if not self._count:
            self._first_step = step
        self._last_step = step
        self._count += 1
        self._open.append(seconds)
        if len(self._open) == CHUNK:
            self._chunks.append(_low(self._open))
            self._open = []

    def epoch_ended(self) -> bool:
        """Close the open epoch; True when it became a point (a new judgement is due),
        False while it has fewer than ``min_block`` steps (it goes on into the next)."""
        if self._count < self.min_block:
            return False
        lows = self._chunks + ([_low(self._open)] if len(self._open) >= self.min_block else [])
        low = median(lows) if lows else _low(self._open)
        self._lows.append(((self._first_step + self._last_step) / 2, low))
        self._open, self._chunks, self._count = [], [], 0
        if len(self._early) < BASE_BLOCKS:
            self._early.append(low)
            if self.base is None or low < self.base:
                self.base, self.base_end = low, self._last_step
                self._base_index = self._closed
        self._closed += 1
        return True

    def judge(self, raised: bool) -> LongTrend | None:
        """The shortest horizon that holds (its tests loosened once ``raised``), else None."""
        base = self.base
        # epochs before the one that set the start, when one of them was ``growth``
        # times slower (a first epoch that fills a cache), are no part of a horizon
        lows = list(self._lows)
        first = self._base_index - (self._closed - len(lows))  # its place in the deque
        if first > 0 and max(y for _, y in lows[:first]) >= self.growth * (base or 0.0):
            lows = lows[first:]
        n = len(lows)
        # a raised slowdown is kept from the first epochs on (bursts can clear the
        # 30-step window of a young run while it goes on)
        if base is None or n < (BASE_BLOCKS if raised else MIN_BLOCKS):
            return None
        # Most runs never slow down: their newest lows are nowhere near the ratio, and
        # a trend line that puts the newest epoch there far above its own recent lows
        # is no trend to trust.
        floor = RECENT_SHARE * (self.ratio - HYSTERESIS) * base
        if max(y for _, y in lows[-3:]) < floor:
            return None
        for scale in SCALES[:HOLD_SCALES] if raised else SCALES:
            span = min(self.blocks, n) * scale if scale == 1 else self.blocks * scale
            if n < span:
                break
            points = lows[-span:]
            xs = [sum(p[0] for p in points[k : k + scale]) / scale for k in range(0, span, scale)]
            ys = [sum(p[1] for p in points[k : k + scale]) / scale for k in range(0, span, scale)]
            found = self._holds(xs, ys, base, raised)
            if found is not None:
                return found
        return None

    def _holds(
        self, xs: list[float], ys: list[float], base: float, raised: bool
    ) -> LongTrend | None:
        loosen = HYSTERESIS if raised else 0.0
        needed = self.rising - loosen
        # most horizons of a steady run end here, on a count (~0.5 for noise)
        if base <= 0 or _rising(ys) < needed:
            return None
        slope, last, rising = trend(xs, ys)
        if rising < needed or last < (self.ratio - loosen) * base:
            return None
        rise = slope * (xs[-1] - xs[0])
        jitter = 1.4826 * median(
            [abs(y - (last + slope * (x - xs[-1]))) for x, y in zip(xs, ys, strict=True)]
        )
        if rise < self.noise * jitter:
            return None
        if raised:
            return LongTrend(xs, ys, slope, last, rising, jitter, base, self.base_end)
        first = last - rise
        half = len(xs) // 2
        if (
            first <= 0
            or last < self.growth * first
            or any(len(h) >= 5 and _rising(h) < HALF_RISING for h in (ys[:half], ys[half:]))
            or self._uneven(xs, ys, slope)
        ):
            return None
        return LongTrend(xs, ys, slope, last, rising, jitter, base, self.base_end)

    def _uneven(self, xs: list[float], ys: list[float], slope: float) -> bool:
        """Whether one half of the horizon rises at less than ``even`` times the other's
        slope or the whole's: a level shift (at once, or over a few epochs as another
        process starts its work) is steep in the half that holds it and flat in the
        other, or flat in both, where Theil–Sen sees past the climb's one or two
        points; a trend rises alike all along."""
        half = len(xs) // 2
        first, second = theil_sen(xs[:half], ys[:half]), theil_sen(xs[half:], ys[half:])
        return min(first, second) < self.even * max(first, second, slope)
