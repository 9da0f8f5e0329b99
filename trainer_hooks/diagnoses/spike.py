"""``spike``: the loss or a block's gradient norm leaves its rolling band.

Loss spikes in transformer training usually show first in the gradient of one block
and travel down the stack. This detector keeps a rolling band per quantity: the
median and the median absolute deviation (MAD) of its last ``spike_window`` (100)
recorded values. A value spikes when it is above the band by both

- a robust z-score of at least ``spike_z`` (6): ``(x − median) / (1.4826 · MAD)``
  (1.4826 · MAD is the standard deviation of normal noise, and unlike it a few
  earlier spikes do not widen the band), taken on logarithms when the values are
  positive (losses and norms are; their noise is multiplicative: the fixed
  ``rotation_lstm`` has batch losses from 1 to 300, and at 287 it is not spiking,
  while on raw values its robust z reached 8.5), and
- at least ``spike_min_rise`` (0.5) times the median's size: the loss is at least
  1.5x its median, so a quantity whose band is very narrow (a loss that has
  converged) does not raise on a change nobody would call a spike. A block's
  gradient norm varies more from batch to batch than the loss, and must reach
  ``spike_block_min_rise`` (1.0): 2x its median (the healthy tiny GPT's first block
  reached 1.54x, robust z 6.8, on a batch whose loss did not move).

A positive value at least ``spike_over_max`` (4) times the largest value in the band
spikes whatever its z-score: while the loss still falls fast (early training) the
band of logarithms is wide, and a loss 47,000x its median (a target 50x off at step
25 of a regression) had a robust z of only 5.6.

Only rises count (a loss falling fast is training). Judged once
``spike_min_history`` (20) values are in the band; a quantity whose median is 0 has
no band. Subjects: ``loss`` (every step record) and each stack of the ``depth``
series (heavy steps), where each block l has its own band and the alert names the
first block **in backward order** (the highest l) that left it: where the gradient
spike entered the stack on its way back from the loss. A loss spike names that
block too when the same record has one.

Raised at the step itself (an event, judged against the run's own history), cleared
after ``spike_clear_after`` (3) judgements back in band. All spike alerts are one
problem (``spike``). Pure Python on the Monitor's background thread: the training
thread never waits for these numbers.

Example:
    >>> from .thresholds import resolve
    >>> d = SpikeDetector(resolve(None))
    >>> for s in range(30):
    ...     _ = d.observe({"kind": "step", "step": s, "loss": 2.0 + 0.01 * (s % 3)})
    >>> d.observe({"kind": "step", "step": 30, "loss": 9.0})["loss"].evidence["median"]
    2.01
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, floats, fmt, median, sig, step_of

#: 1.4826 x MAD estimates the standard deviation of normal noise
MAD_TO_SIGMA = 1.4826

_HINT = (
    "Look at the data of this step first (a batch of extreme, corrupted or mislabelled "
    "examples spikes once and passes); if spikes repeat, the steps are too large: warm "
    "the learning rate up from a small value, lower it, or clip the gradient norm "
    "(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=...)). A spike that "
    "enters the stack at its top blocks and travels down is the optimizer's step; one "
    "that starts at the first block came with the input"
)


@dataclass
class Jump:
    """One value that left its band: how far, against what."""

    value: float
    median: float
    z: float
    history: int

    def evidence(self) -> dict[str, Any]:
        """Where the value stood against its band: median, ratio, robust z, window."""
        return {
            "median": sig(self.median),
            "ratio": sig(self.value / self.median),
            "z": sig(self.z) if math.isfinite(self.z) else "Infinity",
            "window": self.history,
        }


class Band:
    """The rolling median/MAD band of one quantity.

    Example:
        >>> b = Band(window=50, min_history=3, z=6.0, min_rise=1.0)
        >>> [b.judge(v) for v in (1.0, 1.1, 0.9)]
        [None, None, None]
        >>> b.judge(1.05) is None, b.judge(8.0).median
        (True, 1.025)
    """

    def __init__(
        self,
        window: int,
        min_history: int,
        z: float,
        min_rise: float,
        over_max: float = 4.0,
        rare: float = 0.05,
    ) -> None:
        self.values: deque[float] = deque(maxlen=max(1, window))
        # the same values kept sorted (insort/remove as the window slides): the median
        # is then one lookup instead of a sort per record, per block (~6 µs -> ~1 µs)
        self._sorted: list[float] = []
        self.min_history = max(1, min_history)
        self.z = z
        self.min_rise = min_rise
        self.over_max = over_max
        self.rare = rare
        #: whether the last value was judged (enough history and a band to judge against)
        self.judged = False

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        mid = n // 2
        return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0

    def _clears_top(self, x: float) -> bool:
        """Whether ``x`` rises ``min_rise`` over all but the band's top ``rare`` too: a
        quantity with two modes (a loss) has the MAD of one, and a value of its other
        mode is no spike, however far it is from the median."""
        ordered = self._sorted
        top = ordered[len(ordered) - 1 - int(self.rare * len(ordered))]
        return x - top >= self.min_rise * abs(top)

    def judge(self, x: float) -> Jump | None:
        """The jump when ``x`` spikes, else None; then ``x`` joins the band."""
        jump = None
        self.judged = False
        if len(self.values) >= self.min_history:
            mid = self.median()
            if mid != 0:
                self.judged = True
                rise = x - mid
                if rise > 0 and rise >= self.min_rise * abs(mid) and self._clears_top(x):
                    z = robust_z(x, self.values)
                    # far above everything in the band: a spike even when the band is
                    # wide because the quantity is still falling fast (early training)
                    top = self._sorted[-1]
                    beyond = self._sorted[0] > 0 and x >= self.over_max * top
                    if z >= self.z or beyond:
                        jump = Jump(x, mid, z, len(self.values))
        values = self.values
        if len(values) == values.maxlen:
            del self._sorted[bisect_left(self._sorted, values[0])]
        values.append(x)
        insort(self._sorted, x)
        return jump


def robust_z(x: float, values: Sequence[float]) -> float:
    """How far ``x`` lies above ``values``, in robust standard deviations.

    On logarithms when every value is positive (losses and gradient norms are: their
    noise is multiplicative, and a loss that ranges 1-300 from batch to batch is not
    spiking at 287), on the values themselves otherwise. Infinite when the band has
    no spread.

    Example:
        >>> round(robust_z(40.0, [1.0, 2.0, 3.0, 2.0, 1.0]), 2)  # on logarithms
        4.98
        >>> round(robust_z(-1.0, [-3.0, -2.0, -4.0]), 2)  # not all positive: as they are
        1.35
    """
    if x > 0 and min(values) > 0:
        x, values = math.log(x), [math.log(v) for v in values]
    mid = median(values)
    mad = median([abs(v - mid) for v in values])
    return (x - mid) / (MAD_TO_SIGMA * mad) if mad > 0 else math.inf


class SpikeDetector(Detector):
    code = "spike"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._loss = self._band("spike_min_rise")
        self._loss_level = 0.0  # the largest |median| the loss's band has had
        self._min_share = float(config["spike_min_share"])
        self._blocks: dict[str, list[Band]] = {}

    def _band(self, min_rise: str) -> Band:
        c = self.config
        return Band(int(c["spike_window"]), int(c["spike_min_history"]), float(c["spike_z"]),
                    float(c[min_rise]), float(c["spike_over_max"]), float(c["spike_rare"]))

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        if record.get("kind") != "step":
            return {}
        step = step_of(record)
        verdicts: Verdicts = {}
        first: tuple[str, int, int, Jump] | None = None  # the first block of the record
        depth = record.get("depth")
        if isinstance(depth, Mapping):
            for stack, values in depth.items():
                if not isinstance(values, list) or not values:
                    continue
                found = self._stack(str(stack), floats(values), step)
                if found is None:
                    continue
                verdicts[str(stack)], hit = found
                if hit is not None:  # the last stack in model order is first in backward
                    first = hit
        loss = as_float(record.get("loss"))
        if loss is not None and math.isfinite(loss):
            jump = self._loss.judge(loss)
            # A rise of a sliver of the loss's level is none: a converged loss near 0
            # (1e-4, blips of 1e-3 when every example is right) spikes on a log scale
            # only, and the fix the alert names would be wrong. The level is a median,
            # so earlier spikes do not raise it.
            if jump is not None and loss - jump.median < self._min_share * self._loss_level:
                jump = None
            band = self._loss
            if len(band.values) >= band.min_history:
                self._loss_level = max(self._loss_level, abs(band.median()))
            if self._loss.judged:
                verdicts["loss"] = None if jump is None else self._loss_finding(jump, step, first)
        return verdicts

    def _stack(
        self, stack: str, values: list[float], step: int
    ) -> tuple[Finding | None, tuple[str, int, int, Jump] | None] | None:
        bands = self._blocks.get(stack)
        if bands is None or len(bands) != len(values):  # a new stack, or its depth changed
            bands = self._blocks[stack] = [self._band("spike_block_min_rise") for _ in values]
        jumps: dict[int, Jump] = {}
        judged = False
        for index, (band, value) in enumerate(zip(bands, values, strict=True)):
            if not math.isfinite(value):
                continue  # nonfinite says that
            jump = band.judge(value)
            judged = judged or band.judged
            if jump is not None:
                jumps[index] = jump
        if not judged:
            return None
        if not jumps:
            return None, None
        block = max(jumps)  # backward runs from the last block to the first
        jump = jumps[block]
        n = len(values)
        spiked = sorted(jumps, reverse=True)
        evidence = {
            "step": step,
            "first_block": block,
            "blocks": n,
            "spiked_blocks": spiked[:20],
            "value": sig(jump.value),
            **jump.evidence(),
        }
        message = (
            f"{stack}: the gradient spiked at step {step}, first at block {block} of {n} in "
            f"backward order: ‖∂L/∂x_{block}‖ = {fmt(jump.value)}, "
            f"{fmt(jump.value / jump.median)}x its median of the last {jump.history} recorded "
            f"steps ({fmt(jump.median)}, robust z {_z(jump.z)}); {len(spiked)} of {n} blocks "
            "left their band"
        )
        finding = Finding("warning", message, _HINT, evidence, immediate=True, problem="spike",
                          clear_after=int(self.config["spike_clear_after"]))
        return finding, (stack, block, n, jump)

    def _loss_finding(
        self, jump: Jump, step: int, first: tuple[str, int, int, Jump] | None
    ) -> Finding:
        evidence: dict[str, Any] = {
            "step": step,
            "loss": sig(jump.value),
            **jump.evidence(),
        }
        message = (
            f"the loss spiked at step {step}: {fmt(jump.value)}, {fmt(jump.value / jump.median)}x"
            f" its median of the last {jump.history} steps ({fmt(jump.median)}, robust z "
            f"{_z(jump.z)})"
        )
        if first is not None:
            stack, block, n, _ = first
            evidence["first_stack"], evidence["first_block"] = stack, block
            message += (
                f"; the gradient first spiked at block {block} of {n} of {stack} "
                "(backward order)"
            )
        return Finding("warning", message, _HINT, evidence, immediate=True, problem="spike",
                       clear_after=int(self.config["spike_clear_after"]))


def _z(z: float) -> str:
    return fmt(z) if math.isfinite(z) else "∞ (the band had no spread)"
