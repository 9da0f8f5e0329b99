"""``exploding``: gradient norms growing through time, or over training steps.

Two conditions, two kinds of subject:

- through time (subject: the recurrent module): the earliest quarter of the
  per-timestep series is, in log-mean, ``exploding_time_ratio`` (1e3) times the
  latest quarter: the gradient grows as it flows back.
- over steps (subject ``total_norm``): a spike of the total gradient norm
  (``exploding_step_ratio``, 50, times the median of the last ``exploding_window``,
  50, recorded steps, and larger than any earlier in the run) that wrecked the update
  it fed: the loss goes non-finite or leaves its band within ``exploding_harm_steps``
  (5) steps (``spikes.SpikeJudge``). A spike the optimizer absorbs (Adam moves each
  weight by about the learning rate whatever the gradient's size) is no alert.

Magnitude, not ratios: neither condition judges gradients at the noise floor
(``timeseries.Floor``: 0, below ``gradient_floor_abs``, or below ``gradient_floor``
of their own peak in the run), where 4e-26 over 4e-40 is a huge ratio of nothing;
``no_gradient`` says that plainly instead. Through time is judged only where the
module's calls form a chain (``timestep_layout``). Over steps it is raised on the
first record that shows the harm (an event, not a matter of noise).

The suggested clip value is the ``exploding_clip_quantile`` (0.9) quantile of the
recent finite total norms: it leaves ordinary steps alone and caps the spikes.

Example:
    >>> from gradwatch.trainer_hooks.diagnoses.thresholds import resolve
    >>> d = ExplodingDetector(resolve(None))
    >>> for s in range(5):
    ...     _ = d.observe({"kind": "step", "step": s, "total_norm": 1.0 + s / 10, "loss": 2.0})
    >>> d.observe({"kind": "step", "step": 5, "total_norm": 900.0, "loss": 2.0})["total_norm"]
    >>> wrecked = d.observe({"kind": "step", "step": 6, "total_norm": 1e4, "loss": 5e3})
    >>> wrecked["total_norm"].evidence["clip"]  # from the norms before the spike
    1.36
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, fmt, quantile, sig, step_of
from .spikes import Episode, SpikeJudge
from .timeseries import Floor, finite_positive, is_chain, pick_series


class ExplodingDetector(Detector):
    code = "exploding"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._floor = Floor(config)
        self._spikes = SpikeJudge(config)

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
        heavy = total is not None and math.isfinite(total)
        if heavy and self._floor.at_floor("", total):  # type: ignore[arg-type]
            total = None  # at the noise floor: judged, no spike to speak of
        step = step_of(record)
        episode = self._spikes.observe(step, total if heavy else None, as_float(record.get("loss")))
        if episode is not None and episode.harm is not None and (episode.fresh or heavy):
            verdicts["total_norm"] = (
                self._over_steps(episode, step) if episode.fresh or episode.misses == 0 else None
            )
        elif heavy:
            verdicts["total_norm"] = None  # judged: no spike, or one the run absorbed
        return verdicts

    def clip(self) -> float | None:
        """The clip value suggested by the recent total norms (None before any)."""
        episode = self._spikes.episode
        # during a spike, the window before it: exploded norms are no guide to a clip
        norms = episode.before if episode is not None else list(self._spikes.norms)
        if not norms:
            return None
        return sig(quantile(norms, float(self.config["exploding_clip_quantile"])))

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

    def _over_steps(self, ep: Episode, step: int) -> Finding:
        harm = ep.harm or {}
        evidence: dict[str, Any] = {
            "total_norm": sig(ep.total),
            "spike_step": ep.step,
            "median_recent": sig(ep.base),
            "ratio": sig(ep.total / ep.base),
            "window": ep.window,
            "largest_since": sig(ep.largest),
            **harm,
            "clip": self.clip(),
        }
        message = (
            f"total gradient norm {fmt(ep.total)} at step {ep.step} is {fmt(ep.total / ep.base)}x "
            f"the median of the {ep.window} recorded steps before it ({fmt(ep.base)}), "
        )
        if isinstance(harm.get("loss"), str):  # "nan", "inf": non-finite
            message += (
                f"and the update wrecked training: the loss went {harm['loss']} at step "
                f"{harm['loss_step']}"
            )
        elif "loss" in harm and ep.band is not None:
            message += (
                f"and the update wrecked training: the loss reached {fmt(harm['loss'])} at "
                f"step {harm['loss_step']}, above its band before the spike "
                f"({fmt(ep.band[0])} to {fmt(ep.band[1])})"
            )
        else:
            message += (
                f"for {harm.get('sustained_steps', ep.held)} recorded steps in a row "
                "(the run records no loss to show the harm)"
            )
        return Finding("warning", message, self._clip_hint(), evidence, immediate=True)
