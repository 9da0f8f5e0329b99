"""``exploding``: gradient norms growing through time, or over training steps.

Two conditions, two kinds of subject:

- through time (subject: the recurrent module): the earliest quarter of the
  per-timestep series is, in log-mean, ``exploding_time_ratio`` (1e3) times the
  latest quarter: the gradient grows as it flows back.
- over steps (subject ``total_norm``): this step's total gradient norm is
  ``exploding_step_ratio`` (50) times the median of the last ``exploding_window``
  (50) recorded steps, and larger than any total norm earlier in the run (a bump
  no larger than the run's first steps took wrecks no update).

Magnitude, not ratios: neither condition judges gradients at the noise floor
(``timeseries.Floor``: 0, below ``gradient_floor_abs``, or below ``gradient_floor``
of their own peak in the run), where 4e-26 over 4e-40 is a huge ratio of nothing;
``no_gradient`` says that plainly instead. Through time is judged only where the
module's calls form a chain (``timestep_layout``). A spike over steps is an event
against the run's own history and is raised at once.

The suggested clip value is the ``exploding_clip_quantile`` (0.9) quantile of the
recent finite total norms: it leaves ordinary steps alone and caps the spikes.

Example:
    >>> d = ExplodingDetector({"exploding_time_ratio": 1e3, "exploding_step_ratio": 50.0,
    ...     "exploding_window": 50, "exploding_min_history": 5, "exploding_clip_quantile": 0.9})
    >>> for s in range(5):
    ...     _ = d.observe({"kind": "step", "step": s, "total_norm": 1.0 + s / 10})
    >>> d.observe({"kind": "step", "step": 5, "total_norm": 900.0})["total_norm"].evidence["clip"]
    1.36
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, fmt, median, quantile, sig, step_of
from .timeseries import Floor, finite_positive, is_chain, pick_series


class ExplodingDetector(Detector):
    code = "exploding"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._norms: deque[float] = deque(maxlen=int(config["exploding_window"]))
        self._floor = Floor(config)
        self._peak = 0.0  # the largest total norm of the run so far

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        if record.get("kind") != "step":
            return {}
        verdicts: Verdicts = {}
        timesteps = record.get("timesteps")
        if isinstance(timesteps, Mapping):
            for module, series in timesteps.items():
                picked = pick_series(series)
                if picked is None or not finite_positive(picked[1]):
                    continue
                if self._floor.at_floor(module, max(picked[1])) or not is_chain(record, module):
                    verdicts[module] = None  # judged: no growth through time to speak of
                    continue
                verdicts[module] = self._through_time(module, *picked)
        total = as_float(record.get("total_norm"))
        if total is not None and math.isfinite(total):
            if self._floor.at_floor("", total):
                verdicts["total_norm"] = None
            else:
                verdicts["total_norm"] = self._over_steps(total, step_of(record))
            self._norms.append(total)
            self._peak = max(self._peak, total)
        return verdicts

    def clip(self) -> float | None:
        """The clip value suggested by the recent total norms (None before any)."""
        if not self._norms:
            return None
        return sig(quantile(list(self._norms), float(self.config["exploding_clip_quantile"])))

    def _clip_hint(self) -> str:
        clip = self.clip()
        value = fmt(clip) if clip else "1.0"
        return (
            "Clip the gradient norm before optimizer.step(): "
            f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={value})"
            f" ({fmt(float(self.config['exploding_clip_quantile']) * 100)}th percentile of "
            "recent total norms); if it keeps growing, lower the learning rate"
        )

    def _through_time(self, module: str, name: str, norms: list[float]) -> Finding | None:
        n = len(norms)
        if n < 8:
            return None
        q = max(1, n // 4)
        early = [v for v in norms[:q] if v > 0]
        late = [v for v in norms[-q:] if v > 0]
        if not early or not late:
            return None
        log_ratio = sum(map(math.log10, early)) / len(early) - sum(map(math.log10, late)) / len(
            late
        )
        ratio = 10**log_ratio
        if ratio < float(self.config["exploding_time_ratio"]):
            return None
        growth = ratio ** (1 / max(1, n - q))
        evidence = {
            "series": name,
            "timesteps": n,
            "early_over_late": sig(ratio),
            "growth_per_timestep": sig(growth),
            "first": sig(norms[0]),
            "last": sig(norms[-1]),
            "clip": self.clip(),
        }
        message = (
            f"{module}: the gradient grows {fmt(ratio)}x as it flows back through {n} "
            f"timesteps (×{growth:.3f} per timestep; timestep 0: {fmt(norms[0])}, "
            f"last: {fmt(norms[-1])})"
        )
        hint = self._clip_hint() + "; or train on shorter chunks (truncated BPTT)"
        return Finding("warning", message, hint, evidence)

    def _over_steps(self, total: float, step: int) -> Finding | None:
        if len(self._norms) < int(self.config["exploding_min_history"]):
            return None
        base = median(list(self._norms))
        if base <= 0 or total < float(self.config["exploding_step_ratio"]) * base:
            return None
        if total <= self._peak:
            # no larger than gradients this run already took (its first steps, say):
            # an ordinary bump for this run, not one that wrecks an update
            return None
        evidence = {
            "total_norm": sig(total),
            "median_recent": sig(base),
            "ratio": sig(total / base),
            "window": len(self._norms),
            "clip": self.clip(),
        }
        message = (
            f"total gradient norm {fmt(total)} at step {step} is {fmt(total / base)}x the "
            f"median of the last {len(self._norms)} recorded steps ({fmt(base)})"
        )
        return Finding("warning", message, self._clip_hint(), evidence, immediate=True)
