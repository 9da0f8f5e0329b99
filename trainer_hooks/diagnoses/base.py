"""What every detector shares: the finding it reports and small robust statistics.

A detector looks at one record at a time and says, for each subject it could judge
on that record, whether its condition holds (a :class:`Finding`) or not (``None``).
Subjects it could not judge (no data on this record) are simply absent, so a light
step between two heavy ones never clears an alert. The engine turns these verdicts
into ``raised`` / ``updated`` / ``cleared`` alert records.

Pure Python over protocol record dicts: no torch here, so detectors are cheap and
testable with hand-built records.

Example:
    >>> theil_sen([0, 1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0, 50.0])  # one outlier, slope still 1
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gradwatch.protocol import to_float

#: what a detector returns for one record: subject -> Finding (holds) or None (judged, fine)
Verdicts = dict[str, "Finding | None"]


@dataclass
class Finding:
    """One condition that holds now: what is wrong, where, the numbers, and the fix."""

    severity: str
    message: str
    hint: str
    evidence: dict[str, Any] = field(default_factory=dict)
    #: raise on the first judgement that holds (a NaN, a spike) instead of waiting for
    #: ``raise_after`` judgements in a row: for events that are no matter of noise
    immediate: bool = False
    #: judgements in a row needed before raising, instead of ``raise_after`` (a
    #: slowdown must outlast a burst of load on the machine)
    sustain: int | None = None
    #: the cause this finding belongs to; findings that share it are one problem (one
    #: card, one count). None: the problem is ``code:subject``
    problem: str | None = None
    #: judgements in a row without the condition before ``cleared``, instead of
    #: ``clear_after`` (a spike clears when the value is back in its band)
    clear_after: int | None = None


class Detector:
    """Base of every detector: ``code`` is the alert code; ``observe`` judges one record."""

    code: ClassVar[str] = ""
    #: the fields without which ``observe`` returns ``{}`` and changes nothing: the
    #: engine does not call it for a record that has none of them (most records are
    #: light steps with a loss and a time only); None: every record
    needs: ClassVar[frozenset[str] | None] = None

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        """Judge one step or epoch record; return verdicts only for subjects judged."""
        return {}

    def note_alert(self, alert: Mapping[str, Any]) -> None:
        """See an alert raised elsewhere (the capture's stale-state check), if useful."""


def step_of(record: Mapping[str, Any]) -> int:
    """The record's step as an int (0 when missing or malformed)."""
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


def as_float(value: Any) -> float | None:
    """A protocol number as a float, or None when absent or malformed."""
    if value is None:
        return None
    if type(value) is float:  # the common case (to_float gives the same float)
        return value
    try:
        return to_float(value)
    except ValueError:
        return None


def floats(values: Sequence[Any]) -> list[float]:
    """A protocol series as floats (``"NaN"``/``"Infinity"`` strings mapped back)."""
    try:  # the common case, in C: float() also reads "NaN", "Infinity", "-Infinity"
        return list(map(float, values))
    except (TypeError, ValueError):
        pass
    out = []
    for v in values:
        f = as_float(v)
        out.append(math.nan if f is None else f)
    return out


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("expected at least one value, got none")
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, q in [0, 1]."""
    s = sorted(values)
    if not s:
        raise ValueError("expected at least one value, got none")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def pairwise_slopes(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    return [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Median of pairwise slopes: a trend that a few outliers (a GC pause) cannot bend."""
    slopes = pairwise_slopes(xs, ys)
    return median(slopes) if slopes else 0.0


def rising_fraction(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Fraction of pairs (i < j) with y_j > y_i: 1.0 for a steady rise, ~0.5 for noise."""
    slopes = pairwise_slopes(xs, ys)
    if not slopes:
        return 0.0
    return sum(1 for s in slopes if s > 0) / len(slopes)


def trend(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(Theil–Sen slope, the trend line's value at the last x, rising fraction).

    One pass over the pairwise slopes serves all three (this runs on every step).
    """
    slopes = pairwise_slopes(xs, ys)
    if not slopes:
        return 0.0, ys[-1], 0.0
    slope = median(slopes)
    rising = sum(1 for s in slopes if s > 0) / len(slopes)
    intercept = median([y - slope * x for x, y in zip(xs, ys, strict=True)])
    return slope, intercept + slope * xs[-1], rising


def fitted_last(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(Theil–Sen slope, the trend line's value at the last x)."""
    slope, last, _ = trend(xs, ys)
    return slope, last


#: once an alert holds, the rising fraction it needs to keep holding is this much lower,
#: so that a noisy step does not clear it and raise it again a few steps later
HYSTERESIS = 0.15


def sig(value: float, digits: int = 3) -> float:
    """Round to ``digits`` significant figures, for evidence that reads well."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def fmt(value: float) -> str:
    """A number for a message: 0.0123, 4.5e-27, 3530, 1.7e+05."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    if 100 <= abs(value) < 1e5:
        return f"{value:.0f}"
    if 1e-3 <= abs(value) < 100:
        return f"{value:.3g}"
    return f"{value:.2g}"
