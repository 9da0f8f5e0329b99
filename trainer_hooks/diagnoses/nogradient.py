"""``no_gradient``: gradients that are 0 or at the noise floor, said plainly.

A module whose per-timestep series (its largest value) or the whole model whose
``total_norm`` is at the noise floor (``timeseries.Floor``: exactly 0, at most
``gradient_floor_abs``, or below ``gradient_floor`` of its own peak earlier in the
run) gets no gradient worth the name. That is one statement of its own: not
``exploding`` (a ratio between 4e-26 and 4e-40 is noise) and not ``vanishing``
(nothing reaches even the last timestep), which both skip such series. Every
subject of this code is one problem: when the loss is 0, nothing gets gradient.

Example:
    >>> from gradwatch.trainer_hooks.diagnoses.thresholds import resolve
    >>> d = NoGradientDetector(resolve(None))
    >>> _ = d.observe({"kind": "step", "step": 0, "loss": 0.7, "total_norm": 0.3,
    ...                "timesteps": {"cell": {"hidden": [0.1, 0.2]}}})
    >>> v = d.observe({"kind": "step", "step": 5, "loss": 0.0, "total_norm": 1e-22,
    ...                "timesteps": {"cell": {"hidden": [4e-26, 4e-40]}}})
    >>> v["cell"].message
    'no gradient reaches cell: loss is 0 (its largest ∂L/∂h is 4e-26, at step 0 it was 0.2)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, fmt, sig, step_of
from .timeseries import Floor, pick_series

#: the subject of the whole model's total gradient norm
MODEL = "model"


class NoGradientDetector(Detector):
    code = "no_gradient"
    needs = frozenset({"timesteps", "total_norm"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._floor = Floor(config)
        self._peak_step: dict[str, int] = {}

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        if record.get("kind") != "step":
            return {}
        step = step_of(record)
        loss = as_float(record.get("loss"))
        verdicts: Verdicts = {}
        timesteps = record.get("timesteps")
        if isinstance(timesteps, Mapping):
            for module, series in timesteps.items():
                picked = pick_series(series)
                if picked is None:
                    continue
                values = picked[1]
                # sum() in C finds any NaN/Inf (nonfinite's business: not judged here)
                if math.isfinite(sum(values)):
                    what = "∂L/∂x" if picked[0] == "input" else "∂L/∂h"
                    verdicts[str(module)] = self._judge(
                        str(module), max(values), step, loss, f"its largest {what}"
                    )
        total = as_float(record.get("total_norm"))
        if total is not None and math.isfinite(total):
            verdicts[MODEL] = self._judge(MODEL, total, step, loss, "the total gradient norm")
        return verdicts

    def _judge(
        self, key: str, value: float, step: int, loss: float | None, what: str
    ) -> Finding | None:
        before = self._floor.peaks.get(key, 0.0)
        if value >= before or key not in self._peak_step:
            self._peak_step[key] = step
        if not self._floor.at_floor(key, value):
            return None
        peak = self._floor.peaks[key]
        where = "the parameters" if key == MODEL else key
        cause = "loss is 0" if loss == 0 else f"loss is {fmt(loss)}" if loss is not None else ""
        numbers = f"{what} is {fmt(value)}"
        if peak > value:
            numbers += f", at step {self._peak_step[key]} it was {fmt(peak)}"
        message = f"no gradient reaches {where}: " + (f"{cause} ({numbers})" if cause else numbers)
        hint = (
            "Nothing trains while the gradient is 0. If the loss is 0, check that it "
            "compares the model's output with the target (not the target with itself, "
            "not a detached tensor) and that the model has not saturated (outputs clamped, "
            "log-probabilities of 1); otherwise check that the module's output reaches the "
            "loss (no .detach(), torch.no_grad() or .data on the way)"
        )
        evidence: dict[str, Any] = {
            "norm": sig(value),
            "peak": sig(peak),
            "peak_step": self._peak_step[key],
            "floor": sig(max(self._floor.absolute, self._floor.relative * peak)),
        }
        if loss is not None:
            evidence["loss"] = sig(loss)
        return Finding("warning", message, hint, evidence, problem=self.code)
