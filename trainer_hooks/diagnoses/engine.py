"""The diagnosis engine: runs every detector over the record stream, emits alerts.

Runs on the Monitor's background thread, never on the training thread. It turns
each detector's per-record verdicts into alert records with a life cycle: an alert,
identified by ``(code, subject)``, is ``raised`` once its condition held for
``raise_after`` judgements in a row (at once for events such as a NaN), ``updated``
at most every ``update_every`` steps while it holds and its evidence changed, and
``cleared`` after ``clear_after`` judgements in a row without the condition.

Alerts are grouped by cause: each carries ``problem`` (alerts that share it are one
problem: the capture's stale-state alerts on ``lstm1``, ``lstm2``, ``lstm3`` and the
graph's own growth are one), and the first record of each problem in the run has
``opens_problem: true``, which is what the server and the dashboard count.

Example:
    >>> engine = DiagnosisEngine({"clear_after": 2})
    >>> bad = {"kind": "step", "step": 3, "t": 0.0, "loss": "NaN"}
    >>> [(a["code"], a["state"], a["subject"]) for a in engine.observe(bad)]
    [('nonfinite', 'raised', 'loss')]
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gradwatch.protocol.warnings import WarnOnce

from .base import Detector, Finding
from .exploding import ExplodingDetector
from .graph_growth import GraphGrowthDetector
from .hotspot import HotspotDetector
from .nogradient import NoGradientDetector
from .nonfinite import NonfiniteDetector
from .slowdown import SlowdownDetector
from .spike import SpikeDetector
from .thresholds import resolve
from .vanishing import VanishingDetector

# exploding before nonfinite: a loss that goes non-finite at the step an explosion is
# raised joins that problem (_record), which must be open by then
DETECTORS: tuple[type[Detector], ...] = (
    ExplodingDetector,
    NonfiniteDetector,
    NoGradientDetector,
    VanishingDetector,
    GraphGrowthDetector,
    SlowdownDetector,
    HotspotDetector,
    SpikeDetector,
)


@dataclass
class _AlertState:
    finding: Finding
    last_emitted_step: int
    emitted_evidence: dict[str, Any]
    misses: int = 0
    first_miss_step: int | None = None


def problem_of(code: str, subject: str, finding: Finding | None = None) -> str:
    """The cause an alert belongs to: alerts that share it are one problem.

    Every ``graph_growth`` (the capture's per-module stale state and the graph's own
    growth) is one cause, so is every ``no_gradient``; otherwise ``code:subject``.

    Example:
        >>> problem_of("graph_growth", "lstm2"), problem_of("vanishing", "lstm")
        ('graph_growth', 'vanishing:lstm')
    """
    if finding is not None and finding.problem:
        return finding.problem
    if code in ("graph_growth", "no_gradient"):
        return code
    return f"{code}:{subject}"


class DiagnosisEngine:
    """Turns the record stream into alert records (docs/DIAGNOSES.md).

    ``config`` overrides thresholds by name (``thresholds.THRESHOLDS`` lists them);
    an unknown name raises ``ValueError`` naming the known ones.

    Example:
        >>> engine = DiagnosisEngine()
        >>> engine.observe({"kind": "step", "step": 0, "t": 0.0, "duration_s": 0.1})
        []
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = resolve(config)
        self.detectors = [cls(self.config) for cls in DETECTORS]
        self._active: dict[tuple[str, str], _AlertState] = {}
        # judgements in a row that held, for conditions not raised yet
        self._pending: dict[tuple[str, str], int] = {}
        self._problems: set[str] = set()
        self._failed: set[str] = set()
        self._once = WarnOnce()
        self._last_step = 0
        self._last_t = 0.0

    def observe(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Judge one record; return the alert records to emit after it (often none)."""
        kind = record.get("kind")
        if kind == "alert":
            # The capture's own alerts (stale hidden state) name modules our detectors
            # cannot see; let them mention it, and group them with ours by cause.
            if isinstance(record, dict) and isinstance(record.get("code"), str):
                problem = problem_of(record["code"], str(record.get("subject", "")))
                record["problem"] = problem
                record["opens_problem"] = problem not in self._problems
                self._problems.add(problem)
            for detector in self.detectors:
                detector.note_alert(record)
            return []
        if kind not in ("step", "epoch"):
            return []
        step = record.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else self._last_step
        t = record.get("t")
        t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else time.time()
        self._last_step, self._last_t = step, t
        alerts: list[dict[str, Any]] = []
        fields = record.keys()
        for detector in self.detectors:
            if detector.needs is not None and fields.isdisjoint(detector.needs):
                continue  # it would return {} and change nothing
            try:
                verdicts = detector.observe(record)
            except Exception as e:  # a broken detector must never stop the monitor
                self._failed.add(detector.code)
                self._once.warn(
                    f"diagnosis:{detector.code}",
                    f"gradwatch: the {detector.code} diagnosis failed on step {step} and "
                    f"is skipped from now on ({type(e).__name__}: {e})",
                )
                continue
            for subject, finding in verdicts.items():
                if finding is None and not (self._active or self._pending):
                    continue  # nothing held or pending: _advance would change nothing
                alert = self._advance(detector.code, subject, finding, step, t)
                if alert is not None:
                    alerts.append(alert)
        if self._failed:
            self.detectors = [d for d in self.detectors if d.code not in self._failed]
        return alerts

    def finish(self) -> list[dict[str, Any]]:
        """At the end of the run: one last ``updated`` for alerts whose evidence moved."""
        alerts = []
        for (code, subject), state in self._active.items():
            if state.finding.evidence != state.emitted_evidence:
                alerts.append(
                    self._record(
                        code, subject, "updated", state.finding, self._last_step, self._last_t
                    )
                )
                state.emitted_evidence = state.finding.evidence
        return alerts

    def _exploding_problem(self) -> str | None:
        for (code, subject), state in self._active.items():
            if code == "exploding":
                return problem_of(code, subject, state.finding)
        return None

    @property
    def active(self) -> list[tuple[str, str]]:
        """``(code, subject)`` of every alert that holds now."""
        return list(self._active)

    def _advance(
        self, code: str, subject: str, finding: Finding | None, step: int, t: float
    ) -> dict[str, Any] | None:
        key = (code, subject)
        state = self._active.get(key)
        if finding is not None:
            if state is None:
                held = self._pending.get(key, 0) + 1
                needed = finding.sustain or int(self.config["raise_after"])
                if held < needed and not finding.immediate:
                    self._pending[key] = held
                    return None
                self._pending.pop(key, None)
                self._active[key] = _AlertState(finding, step, finding.evidence)
                return self._record(code, subject, "raised", finding, step, t)
            state.finding, state.misses, state.first_miss_step = finding, 0, None
            if (
                step - state.last_emitted_step >= int(self.config["update_every"])
                and finding.evidence != state.emitted_evidence
            ):
                state.last_emitted_step, state.emitted_evidence = step, finding.evidence
                return self._record(code, subject, "updated", finding, step, t)
            return None
        if state is None:
            self._pending.pop(key, None)  # not sustained: start counting again
            return None
        state.misses += 1
        if state.first_miss_step is None:
            state.first_miss_step = step
        if state.misses < (state.finding.clear_after or int(self.config["clear_after"])):
            return None
        del self._active[key]
        cleared = Finding(
            severity="info",
            message=f"{code} on {subject} no longer holds (since step {state.first_miss_step})",
            hint=state.finding.hint,
            evidence={"since_step": state.first_miss_step, "checks": state.misses},
            problem=state.finding.problem,
        )
        return self._record(code, subject, "cleared", cleared, step, t)

    def _record(
        self, code: str, subject: str, state: str, finding: Finding, step: int, t: float
    ) -> dict[str, Any]:
        problem = problem_of(code, subject, finding)
        if code == "nonfinite":
            # NaN/Inf while gradients explode is the explosion's doing: one problem, one
            # card, whose fix (clip, lower the learning rate) is the explosion's
            problem = self._exploding_problem() or problem
        opens = state == "raised" and problem not in self._problems
        self._problems.add(problem)
        return {
            "kind": "alert",
            "step": step,
            "code": code,
            "severity": finding.severity,
            "state": state,
            "subject": subject,
            "message": finding.message,
            "hint": finding.hint,
            "evidence": dict(finding.evidence),
            "t": t,
            "problem": problem,
            "opens_problem": opens,
        }
