"""Picking and reading one module's per-timestep gradient series from a step record.

Shared by ``vanishing`` and ``exploding``: both judge, per recurrent module, the
series of ``‖∂L/∂x_t‖`` (fused layers, ``"input"``) or ``‖∂L/∂h_k‖`` (cells in a
loop, ``"hidden"``), in sequence order.

Example:
    >>> pick_series({"hidden": [1.0, 2.0], "cell": [3.0, 4.0]})
    ('hidden', [1.0, 2.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import floats
from .thresholds import THRESHOLDS

#: which series speaks for the module, in order of preference
_PREFERRED = ("input", "hidden")


def pick_series(series: Any) -> tuple[str, list[float]] | None:
    """The series that shows how far gradient reaches back, as floats; None if none."""
    if not isinstance(series, Mapping):
        return None
    names = [n for n in _PREFERRED if n in series]
    names += sorted(n for n in series if n not in _PREFERRED and n != "cell")
    for name in names:
        values = series[name]
        if isinstance(values, list) and values:
            return name, floats(values)
    return None


def finite_positive(values: list[float]) -> bool:
    # A NaN or infinity anywhere makes the sum non-finite (so would an overflow of
    # ~1e308 values, which is no gradient to judge either); sum() runs in C.
    return math.isfinite(sum(values)) and max(values) > 0


def decay_per_timestep(values: list[float], start: int, end: int) -> float | None:
    """Geometric factor by which the norm changes per timestep from ``end`` back to ``start``.

    0.8 means each step back in time keeps 80% of the gradient. Zeros (float64
    underflow) are skipped: the factor comes from the earliest positive value.
    """
    while start < end and values[start] <= 0:
        start += 1
    if end <= start or values[end] <= 0:
        return None
    return float(math.exp(math.log(values[start] / values[end]) / (end - start)))


def is_chain(record: Mapping[str, Any], module: str) -> bool:
    """Whether a module's calls form a chain (call k fed call k-1's state).

    The capture says so in ``timestep_layout`` (``{module: "chain" | "tree"}``);
    absent means chain. Only chains are judged through time: a cell applied over a
    tree has no "timestep 0" that gradient must reach.
    """
    layout = record.get("timestep_layout")
    return not isinstance(layout, Mapping) or layout.get(module, "chain") != "tree"


class Floor:
    """The noise floor of gradients, from the run's own history.

    A gradient norm is at the floor when it is 0, at most ``gradient_floor_abs``, or
    below ``gradient_floor`` (1e-7, float32's resolution) of the largest the same
    quantity reached earlier in the run: added to parameters of the size the run's
    own gradients had, it changes nothing.

    Example:
        >>> f = Floor({"gradient_floor": 1e-7, "gradient_floor_abs": 1e-20})
        >>> f.at_floor("cell", 0.5), f.at_floor("cell", 4e-26), f.at_floor("cell", 0.01)
        (False, True, False)
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.relative = float(config.get("gradient_floor", THRESHOLDS["gradient_floor"][0]))
        self.absolute = float(config.get("gradient_floor_abs", THRESHOLDS["gradient_floor_abs"][0]))
        self.peaks: dict[str, float] = {}

    def at_floor(self, key: str, value: float) -> bool:
        """Judge ``value`` against the floor, then remember it in ``key``'s history."""
        if not math.isfinite(value) or value < 0:
            return False  # not a norm: nothing to judge
        peak = max(self.peaks.get(key, 0.0), value)
        self.peaks[key] = peak
        return value <= self.absolute or value < self.relative * peak
