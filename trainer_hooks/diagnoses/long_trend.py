"""The step time's trend over hundreds of steps: ``slowdown``'s second look.

``slowdown``'s window is 30 steps. A slowdown that adds little per step beside the
step-time jitter never shows in 30 steps, however far it goes: a CNN whose steps grew
steadily from 2.6 to 7.3 ms over 2,000 steps (a list that grew every step) raised
nothing, and a 10x slowdown that bursts of slow steps cleared was never raised
again. :class:`StepTimeLows` looks at the same step times over a longer horizon.

Each block of ``block`` steps becomes one number, its low (``LOW_QUANTILE``: the
3rd-fastest of 30 steps). Work that grows with time makes every step slower, the
fastest included; a burst of load from other processes, an evaluation or a checkpoint
make some steps slower and leave the fastest as they were. Where steps are short
beside the scheduler's time slice (a few ms), another process sharing the core leaves
the low where it was altogether (its median doubled, its low moved 2 %, on recorded
runs). The lows of the last ``blocks`` blocks are judged, and those of the last
``2 x blocks`` and ``4 x blocks`` blocks in pairs and fours (means), so the horizon is
360, 720 and 1,440 steps with the defaults.

A horizon holds when, on its lows, the Theil–Sen trend puts the newest block at
``ratio`` times the run's first block or slower, at least ``rising`` of the pairs got
slower, the trend grew ``growth`` times over the horizon itself, its rise is ``noise``
times the lows' jitter about the trend line, each half rises on its own
(``HALF_RISING``), and each half's slope is at least ``even`` times the other's and
the whole's: a level shift when a long-stepped run starts sharing its core (the low
doubles at once, or over a few blocks as the other process starts its work) is steep
in one half and flat in the other, or flat in both. Once raised, the rising fraction
and the ratio less ``HYSTERESIS`` and the noise test keep it, judged from
``MIN_BLOCKS_RAISED`` blocks on while the first horizon fills.

Example:
    >>> lows = StepTimeLows(block=10, blocks=6, ratio=1.5, rising=0.8, growth=1.2,
    ...                     noise=3.0, even=0.33)
    >>> ms = [1e-3 * (2 + 0.01 * s + (s % 3)) for s in range(400)]  # noisy, rising
    >>> closed = [lows.push(float(s), t) for s, t in enumerate(ms)]
    >>> seen = lows.judge(raised=False)  # 60 steps grew too little: 120, in pairs
    >>> round(seen.last / seen.base, 1), seen.xs[-1] - seen.xs[0], len(seen.xs)
    (2.9, 100.0, 6)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .base import HYSTERESIS, median, theil_sen, trend

#: a block's low: this quantile of its step times (the 3rd-fastest of 30)
LOW_QUANTILE = 0.1
#: each horizon judges ``blocks`` points: single blocks, then pairs, then fours
SCALES = (1, 2, 4)
#: a horizon is judged only when one of the three newest lows is at least this share
#: of the ratio (less ``HYSTERESIS``) times the first block's
RECENT_SHARE = 0.8
#: the fewest blocks that keep a raised slowdown while the horizon fills
MIN_BLOCKS_RAISED = 4
#: the rising fraction each half of a horizon needs on its own (noise: 0.5 ± 0.13)
HALF_RISING = 0.7


@dataclass(frozen=True)
class LongTrend:
    """A horizon that holds: its points (step, low seconds) and their trend."""

    xs: list[float]
    ys: list[float]
    slope: float
    last: float
    rising: float
    jitter: float
    #: the low of the run's first block: the starting speed it is measured against
    base: float


def _rising(ys: list[float]) -> float:
    """The rising fraction of points at increasing x: a count, no slopes."""
    n = len(ys)
    up = sum(1 for i in range(n) for j in range(i + 1, n) if ys[j] > ys[i])
    return up / (n * (n - 1) / 2) if n > 1 else 0.0


class StepTimeLows:
    """Block lows of the step time and the trend of the last ones (module docstring)."""

    def __init__(
        self,
        block: int,
        blocks: int,
        ratio: float,
        rising: float,
        growth: float,
        noise: float,
        even: float,
    ) -> None:
        if block < 1 or blocks < 4:
            raise ValueError(f"expected block >= 1 and blocks >= 4, got {block}, {blocks}")
        self.block, self.blocks = block, blocks
        self.ratio, self.rising, self.growth = ratio, rising, growth
        self.noise, self.even = noise, even
        self._open: list[float] = []
        self._first_step = 0.0
        self._lows: deque[tuple[float, float]] = deque(maxlen=blocks * SCALES[-1])
        self.base: float | None = None

    def push(self, step: float, seconds: float) -> bool:
        """Add one step's time; True when it closed a block (a new judgement is due)."""
        if not self._open:
            self._first_step = step
        self._open.append(seconds)
        if len(self._open) < self.block:
            return False
        times = sorted(self._open)
        low = times[int(LOW_QUANTILE * (len(times) - 1))]
        self._lows.append(((self._first_step + step) / 2, low))
        self._open = []
        if self.base is None:
            self.base = low
        return True

    def judge(self, raised: bool) -> LongTrend | None:
        """The shortest horizon that holds (looser once ``raised``), else None."""
        # Most runs never slow down: their newest lows are nowhere near the ratio, and
        # a trend line that puts the newest block there far above its own recent lows
        # is no trend to trust. This keeps a light record's diagnoses at what they
        # cost without the horizon (a block's judgement is ~30 µs).
        base, n = self.base, len(self._lows)
        floor = RECENT_SHARE * (self.ratio - HYSTERESIS) * (base or 0.0)
        if base is None or max(self._lows[k][1] for k in range(max(n - 3, 0), n)) < floor:
            return None
        lows = list(self._lows)
        for scale in SCALES:
            span = self.blocks * scale
            if len(lows) < span:
                # a raised slowdown is kept by the blocks there are (a young run's
                # bursts can clear the 30-step window before the horizon is full)
                if not (raised and scale == 1 and len(lows) >= MIN_BLOCKS_RAISED):
                    break
                span = len(lows)
            points = lows[-span:]
            xs = [sum(p[0] for p in points[k : k + scale]) / scale for k in range(0, span, scale)]
            ys = [sum(p[1] for p in points[k : k + scale]) / scale for k in range(0, span, scale)]
            found = self._holds(xs, ys, raised)
            if found is not None:
                return found
        return None

    def _holds(self, xs: list[float], ys: list[float], raised: bool) -> LongTrend | None:
        base = self.base
        needed = self.rising - (HYSTERESIS if raised else 0.0)
        # most horizons of a steady run end here, on a count (~0.5 for noise)
        if base is None or base <= 0 or _rising(ys) < needed:
            return None
        slope, last, rising = trend(xs, ys)
        # the ratio is loosened alike once raised: noise about it must not clear it
        if rising < needed or last < (self.ratio - (HYSTERESIS if raised else 0.0)) * base:
            return None
        rise = slope * (xs[-1] - xs[0])
        jitter = 1.4826 * median(
            [abs(y - (last + slope * (x - xs[-1]))) for x, y in zip(xs, ys, strict=True)]
        )
        if rise < self.noise * jitter:
            return None
        if not raised:
            first = last - rise
            half = len(xs) // 2
            if (
                first <= 0
                or last < self.growth * first
                or self._uneven(xs, ys, slope)
                or _rising(ys[:half]) < HALF_RISING
                or _rising(ys[half:]) < HALF_RISING
            ):
                return None
        return LongTrend(xs, ys, slope, last, rising, jitter, base)

    def _uneven(self, xs: list[float], ys: list[float], slope: float) -> bool:
        """Whether one half of the horizon rises at less than ``even`` times the other's
        slope or the whole's: a level shift (at once, or over a few blocks as another process starts
        its work) is steep in the half that holds it and flat in the other, or flat in
        both, where Theil–Sen sees past the climb's one or two points; a trend rises
        alike all along."""
        half = len(xs) // 2
        first, second = theil_sen(xs[:half], ys[:half]), theil_sen(xs[half:], ys[half:])
        return min(first, second) < self.even * max(first, second, slope)
