"""``nonfinite``: the first parameter, module and timestep whose gradient is NaN or Inf.

Reads the ``nonfinite`` field the capture fills (``{"parameters": [names],
"timesteps": {module: {series: first index}}}``) and a non-finite ``loss``. The
capture lists the parameters in the order backward produced their gradients, so the
first is where backward first met NaN/Inf. The subject is the module that owns that
parameter (or the recurrent module whose timesteps went bad, or ``loss``), so a run
that keeps producing NaN gives one alert that is updated, not one per step.

Example:
    >>> d = NonfiniteDetector({})
    >>> bad = {"parameters": ["lstm.weight_hh_l0"]}
    >>> v = d.observe({"kind": "step", "step": 7, "nonfinite": bad})
    >>> v["lstm"].evidence["first_parameter"]
    'lstm.weight_hh_l0'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, step_of

_HINT = (
    "Lower the learning rate or clip gradients "
    "(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)); check the "
    "inputs and the loss for NaN/Inf (log of 0, division by 0); to find the operation, "
    "run one step under torch.autograd.detect_anomaly(). Under AMP with a GradScaler, "
    "pass watch(..., scaler=scaler) and call monitor.step() after scaler.update(): "
    "the overflow steps the scaler skips are then expected and not reported"
)


#: a record with any of these carries the step's gradients (a captured step): one
#: without (a light step) says nothing of them, and must not clear their alerts
_GRADIENT_FIELDS = ("nonfinite", "total_norm", "param_norms", "timesteps")


def owner(parameter: str) -> str:
    """The module that owns a parameter: ``lstm.weight_hh_l0`` -> ``lstm``."""
    return parameter.rpartition(".")[0] or parameter


class NonfiniteDetector(Detector):
    code = "nonfinite"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._first_step: dict[str, int] = {}
        self._subjects: set[str] = set()

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        if record.get("kind") != "step":
            return {}
        if "nonfinite" not in record:
            loss_value = record.get("loss")
            if loss_value is None or (type(loss_value) is float and math.isfinite(loss_value)):
                # most records (every light step): nothing bad, every subject it has
                # data for fine now; what the full reading below gives them, without
                # its dicts and lists
                return self._judged(record)
        step = step_of(record)
        bad = record.get("nonfinite")
        bad = bad if isinstance(bad, Mapping) else {}
        listed = bad.get("parameters")
        parameters = [p for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
        found = bad.get("timesteps")
        timesteps: dict[str, dict[str, int]] = {
            str(m): {str(k): i for k, i in series.items() if isinstance(i, int)}
            for m, series in (found.items() if isinstance(found, Mapping) else [])
            if isinstance(series, Mapping)
        }
        loss = as_float(record.get("loss"))
        loss_bad = loss is not None and not math.isfinite(loss)

        subject: str | None = None
        if parameters:
            subject = owner(parameters[0])
        elif timesteps:
            subject = next(iter(timesteps))
        elif loss_bad:
            subject = "loss"
        # Judge every subject this record has data for: those not bad on it are fine now.
        verdicts = self._judged(record)
        if subject is None:
            return verdicts
        self._subjects.add(subject)
        first = self._first_step.setdefault(subject, step)

        evidence: dict[str, Any] = {"first_step": first, "step": step}
        where = []
        if parameters:
            evidence["first_parameter"] = parameters[0]
            evidence["parameters"] = parameters[:20]
            evidence["count"] = len(parameters)
            where.append(
                f"parameter {parameters[0]}"
                + (f" and {len(parameters) - 1} more" if len(parameters) > 1 else "")
            )
        if timesteps:
            evidence["timesteps"] = timesteps
            module, series = next(iter(timesteps.items()))
            name, index = min(series.items(), key=lambda kv: kv[1]) if series else ("?", -1)
            evidence["first_module"], evidence["first_timestep"] = module, index
            where.append(f"module {module} from timestep {index} ({name})")
        if loss_bad:
            evidence["loss"] = str(loss)
            where.append(f"the loss ({loss})")
        message = f"NaN/Inf gradient at step {step}: " + "; ".join(where)
        if first != step:
            message += f" (first at step {first})"
        verdicts[subject] = Finding("error", message, _HINT, evidence, immediate=True)
        return verdicts

    def _judged(self, record: Mapping[str, Any]) -> Verdicts:
        """The subjects ``record`` judges, all fine until found bad: the loss wherever
        there is one, the gradients' subjects only on a captured step."""
        if any(field in record for field in _GRADIENT_FIELDS):
            return dict.fromkeys(self._subjects)
        if "loss" in self._subjects and record.get("loss") is not None:
            return {"loss": None}
        return {}
