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
