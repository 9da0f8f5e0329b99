"""A spike of the total gradient norm, and whether it wrecked an update.

``exploding`` over steps judges harm, not a jump alone. Under Adam (or any
optimizer that normalises the gradient), a total norm 200x its median moves each
weight by about the learning rate, as every other step does: the run shrugs it off.
Under plain SGD the same spike moves the weights 200x as far, and the loss shows it.
So a spike is only the suspicion; the alert needs evidence that the update did harm:

- **spike**: a recorded total norm at least ``exploding_step_ratio`` (50) times the
  median of the last ``exploding_window`` (50) recorded steps (once there are
  ``exploding_min_history``, 5, of them), and larger than any total norm earlier in
  the run;
- **harm**: within ``exploding_harm_steps`` (5) steps after the spike, the loss goes
  non-finite or leaves its band: it rises above the highest loss of the window before
  the spike by more than ``exploding_loss_margin`` (1) times the larger of that
  window's spread and that highest loss itself (for positive losses: more than twice
  the highest). The loss of the spike's own step was computed before the update and
  is no evidence. A run that records no loss cannot show harm that way: there the
  spike must be sustained instead, ``raise_after`` (3) recorded steps in a row at
  ``exploding_step_ratio`` times the median before it (recorded steps, however far
  apart ``every=`` puts them).

Once raised the alert holds while the loss stays out of that band or the norm stays
at the spike ratio against the median before the spike (both frozen at the spike,
so a window that fills with exploded norms cannot clear it), and the episode ends
after ``clear_after`` recorded steps without either.

Example:
    >>> judge = SpikeJudge({"exploding_step_ratio": 50.0, "exploding_window": 50,
    ...     "exploding_min_history": 5, "exploding_harm_steps": 5,
    ...     "exploding_loss_margin": 1.0, "raise_after": 3, "clear_after": 10})
    >>> for s in range(6):
    ...     judge.observe(s, 1.0 + s / 10, 2.0 - s / 10)
    >>> judge.observe(6, 500.0, 1.4).harm is None  # a spike: a suspicion, no harm yet
    True
    >>> judge.observe(7, 2.0, 9e4).harm["loss"]  # the update it made wrecked the loss
    90000.0
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .base import median, sig


@dataclass
class Episode:
    """One spike of the total norm and what followed it."""

    step: int  #: the spike's step
    total: float  #: the spike's total norm
    base: float  #: median of the window before the spike (frozen)
    window: int  #: recorded steps in that window
    before: list[float]  #: the total norms of that window
    #: (lowest, highest) finite loss of the window before the spike; None without losses
    band: tuple[float, float] | None
    held: int = 1  #: recorded steps in a row at the spike ratio
    #: the evidence of harm, once seen
    harm: dict[str, Any] | None = None
    raised: bool = False
    misses: int = 0  #: recorded steps in a row without the condition, once raised
    #: whether the record just observed raised it (the first with evidence of harm)
    fresh: bool = False
    largest: float = 0.0  #: the largest total norm since the spike (the spike's included)

    def __post_init__(self) -> None:
        self.largest = max(self.largest, self.total)


class SpikeJudge:
    """Follows the total norm and the loss; says when a spike wrecked an update."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.norms: deque[float] = deque(maxlen=int(config["exploding_window"]))
        self._losses: deque[float] = deque(maxlen=int(config["exploding_window"]))
        self._peak = 0.0  # the largest total norm of the run so far
        self.episode: Episode | None = None

    def ceiling(self, band: tuple[float, float]) -> float:
        """The loss above which it has left its band (see the module docstring)."""
        lo, hi = band
        return hi + float(self.config["exploding_loss_margin"]) * max(hi - lo, abs(hi))

    def observe(self, step: int, total: float | None, loss: float | None) -> Episode | None:
        """One record: ``total`` its finite total norm above the floor (None: not
        recorded or at the floor), ``loss`` its loss (None: absent). Returns the
        episode open after it (None: no spike under way)."""
        ep = self.episode
        if ep is None and total is None:
            # no spike under way and no norm (a light step, most records): only the
            # loss joins the window; the same as the full path below, without it
            if loss is not None and math.isfinite(loss):
                self._losses.append(loss)
            return None
        ratio = float(self.config["exploding_step_ratio"])
        if (
            ep is not None
            and ep.harm is None
            and loss is not None
            and 0 < step - ep.step <= int(self.config["exploding_harm_steps"])
        ):
            ep.harm = self._harm(ep, step, loss)
        if total is not None:
            if ep is None:
                ep = self.episode = self._spike(step, total)
            else:
                ep.held = ep.held + 1 if total >= ratio * ep.base else 0
                ep.largest = max(ep.largest, total)
            self.norms.append(total)
            self._peak = max(self._peak, total)
        if loss is not None and math.isfinite(loss):
            self._losses.append(loss)
        if ep is None:
            return None
        if ep.harm is None and ep.band is None and ep.held >= int(self.config["raise_after"]):
            ep.harm = {"sustained_steps": ep.held}  # no loss to show harm: sustained instead
        if ep.harm is None:
            # with a loss: it had exploding_harm_steps steps to show harm (the loss comes
            # with every step, recorded or light); without: the spike stopped holding
            if ep.band is None:
                over = total is not None and ep.held == 0
            else:
                over = step - ep.step > int(self.config["exploding_harm_steps"])
            if over:
                self.episode = None  # the run shrugged it off
                return None
            return ep
        ep.fresh = not ep.raised
        if not ep.fresh and total is not None:
            holds = ep.held > 0 or (loss is not None and self._out_of_band(ep, loss))
            ep.misses = 0 if holds else ep.misses + 1
            if ep.misses >= int(self.config["clear_after"]):
                self.episode = None
                return None
        ep.raised = True
        return ep

    def _spike(self, step: int, total: float) -> Episode | None:
        if len(self.norms) < int(self.config["exploding_min_history"]):
            return None
        base = median(list(self.norms))
        if base <= 0 or total < float(self.config["exploding_step_ratio"]) * base:
            return None
        if total <= self._peak:
            return None  # no larger than gradients this run already took (its first steps)
        band = (min(self._losses), max(self._losses)) if self._losses else None
        return Episode(step, total, base, len(self.norms), list(self.norms), band)

    def _out_of_band(self, ep: Episode, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        return ep.band is not None and loss > self.ceiling(ep.band)

    def _harm(self, ep: Episode, step: int, loss: float) -> dict[str, Any] | None:
        if not self._out_of_band(ep, loss):
            return None
        harm: dict[str, Any] = {
            "loss": sig(loss) if math.isfinite(loss) else str(loss),
            "loss_step": step,
        }
        if ep.band is not None:
            harm["loss_band"] = [sig(ep.band[0]), sig(ep.band[1])]
            harm["loss_ceiling"] = sig(self.ceiling(ep.band))
        return harm
