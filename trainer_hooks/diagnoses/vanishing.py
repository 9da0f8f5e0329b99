"""``vanishing``: how far back gradient reaches through time in each recurrent module.

The *horizon* is the earliest timestep whose gradient norm is at least
``vanishing_factor`` (1e-3) of the largest in the sequence; the timesteps before it
get, in practice, no gradient. The alert fires when at least
``vanishing_min_fraction`` (a quarter) of a sequence of at least
``vanishing_min_timesteps`` (16) lies before the horizon, and suggests truncated
BPTT with chunks as long as the gradient actually reaches.

Example:
    >>> d = VanishingDetector({"vanishing_factor": 1e-3, "vanishing_min_timesteps": 16,
    ...                        "vanishing_min_fraction": 0.25})
    >>> norms = [0.5 ** (40 - t) for t in range(41)]
    >>> f = d.observe({"kind": "step", "step": 3, "timesteps": {"lstm": {"input": norms}}})
    >>> f["lstm"].evidence["horizon"], f["lstm"].evidence["suggested_truncation"]
    (31, 10)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, fmt, sig
from .timeseries import decay_per_timestep, finite_positive, pick_series


def suggest_truncation(reach: int) -> int:
    """A chunk length for truncated BPTT: the reach, rounded up to a multiple of 5."""
    return max(5, 5 * math.ceil(reach / 5))


class VanishingDetector(Detector):
    code = "vanishing"

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        timesteps = record.get("timesteps")
        if record.get("kind") != "step" or not isinstance(timesteps, Mapping):
            return {}
        verdicts: Verdicts = {}
        for module, series in timesteps.items():
            picked = pick_series(series)
            if picked is None or not finite_positive(picked[1]):
                continue  # nothing to judge (non-finite values are nonfinite's business)
            verdicts[module] = self._judge(module, *picked)
        return verdicts

    def _judge(self, module: str, name: str, norms: list[float]) -> Finding | None:
        n = len(norms)
        if n < int(self.config["vanishing_min_timesteps"]):
            return None
        factor = float(self.config["vanishing_factor"])
        peak = max(norms)
        peak_t = norms.index(peak)
        horizon = next(t for t, v in enumerate(norms) if v >= factor * peak)
        if horizon / n < float(self.config["vanishing_min_fraction"]):
            return None
        reach = n - horizon
        chunk = suggest_truncation(reach)
        decay = decay_per_timestep(norms, 0, peak_t)
        first_ratio = norms[0] / peak
        evidence: dict[str, Any] = {
            "series": name,
            "timesteps": n,
            "horizon": horizon,
            "reach": reach,
            "factor": factor,
            "peak": sig(peak),
            "peak_timestep": peak_t,
            "first": sig(norms[0]),
            "first_over_peak": sig(first_ratio),
            "suggested_truncation": chunk,
        }
        what = "∂L/∂x_t" if name == "input" or name.startswith("layer") else "∂L/∂h_t"
        message = (
            f"{module}: gradient reaches back only {reach} of {n} timesteps; the first "
            f"{horizon} get less than {fmt(factor)} of the peak {what} "
            f"(timestep 0 gets {fmt(first_ratio)} of it)"
        )
        hint = (
            f"Train with truncated BPTT in chunks of about {chunk} timesteps (carry the "
            "hidden state from chunk to chunk, detached), or put a loss on every timestep"
        )
        if decay is not None and 0 < decay < 1:
            evidence["decay_per_timestep"] = sig(decay)
            hint += (
                f"; the gradient keeps ×{decay:.2f} per timestep back, "
                f"and {decay:.2f}^{n} = {fmt(decay**n)}"
            )
        return Finding("warning", message, hint, evidence)
