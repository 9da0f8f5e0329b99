"""``vanishing``: how far back gradient reaches through time in each recurrent module.

The *horizon* is the earliest timestep whose gradient norm is at least
``vanishing_factor`` (1e-3) of the largest in the sequence; the timesteps before it
get, in practice, no gradient. The alert fires when at least
``vanishing_min_fraction`` (a quarter) of a sequence of at least
``vanishing_min_timesteps`` (16) lies before the horizon; once raised it holds down
to three quarters of that fraction. Only chains are judged
(``timestep_layout``), and never a series at the noise floor (``no_gradient``'s).

The fix gives the remedies in order, each with when it applies: a loss at every
timestep (when the targets allow), gating or skip connections (when the output
must depend on early timesteps), and truncated BPTT in chunks as long as the
gradient reaches, only when the task needs no dependence longer than that.

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
from .timeseries import Floor, decay_per_timestep, finite_positive, is_chain, pick_series

#: once raised, the alert holds down to this fraction of ``vanishing_min_fraction``
_HOLD = 0.75


def suggest_truncation(reach: int) -> int:
    """A chunk length for truncated BPTT: the reach, rounded up to a multiple of 5."""
    return max(5, 5 * math.ceil(reach / 5))


class VanishingDetector(Detector):
    code = "vanishing"
    needs = frozenset({"timesteps"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._floor = Floor(config)
        # judgements in a row that held, per module: once there are as many as the
        # engine needs to raise, a looser fraction keeps the alert (hysteresis), so a
        # horizon hovering at the threshold does not flap
        self._streak: dict[str, int] = {}

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        timesteps = record.get("timesteps")
        if record.get("kind") != "step" or not isinstance(timesteps, Mapping):
            return {}
        verdicts: Verdicts = {}
        for module, series in timesteps.items():
            picked = pick_series(series)
            if picked is None or not finite_positive(picked[1]):
                continue  # nothing to judge (non-finite values are nonfinite's business)
            if self._floor.at_floor(module, max(picked[1])) or not is_chain(record, module):
                verdicts[module] = None  # no gradient at all, or no chain through time
                continue
            verdicts[module] = found = self._judge(module, *picked)
            self._streak[module] = self._streak.get(module, 0) + 1 if found else 0
        return verdicts

    def _judge(self, module: str, name: str, norms: list[float]) -> Finding | None:
        n = len(norms)
        if n < int(self.config["vanishing_min_timesteps"]):
            return None
        factor = float(self.config["vanishing_factor"])
        peak = max(norms)
        peak_t = norms.index(peak)
        horizon = next(t for t, v in enumerate(norms) if v >= factor * peak)
        needed = float(self.config["vanishing_min_fraction"])
        if self._streak.get(module, 0) >= int(self.config.get("raise_after", 3)):
            needed *= _HOLD
        if horizon / n < needed:
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
        why = ""
        if decay is not None and 0 < decay < 1:
            evidence["decay_per_timestep"] = sig(decay)
            why = (
                f"The gradient keeps ×{decay:.2f} per timestep back, "
                f"and {decay:.2f}^{n} = {fmt(decay**n)}. "
            )
        hint = (
            why + "In order: (1) if the targets allow, put a loss on every timestep (or "
            "every few), so each gets gradient from nearby; (2) if the output must depend "
            "on early timesteps, use gating or skip connections (LSTM/GRU instead of a "
            "plain RNN, a residual or attention path to early states) and check the "
            "forget-gate bias; (3) only if the task needs no dependence longer than "
            f"about {reach} timesteps, train with truncated BPTT in chunks of about "
            f"{chunk} timesteps (carry the hidden state from chunk to chunk, detached): "
            "truncation makes anything longer unlearnable"
        )
        return Finding("warning", message, hint, evidence)
