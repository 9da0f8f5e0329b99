"""The diagnosis engine: thresholds, the alert life cycle, and records as on the wire."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

from gradwatch.protocol import dumps, loads
from gradwatch.protocol import messages as m
from gradwatch.protocol.warnings import GradwatchWarning
from gradwatch.trainer_hooks.diagnoses import THRESHOLDS, DiagnosisEngine
from gradwatch.trainer_hooks.diagnoses.base import Detector, Verdicts


def step(n: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "step", "step": n, "epoch": 0, "t": 1000.0 + n, **fields}


def test_unknown_threshold_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"got 'vanish_factor'; known: .*vanishing_factor"):
        DiagnosisEngine({"vanish_factor": 1e-3})


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"update_every": 2.5}, "expected an integer, got 2.5"),
        ({"vanishing_factor": "small"}, "expected a number, got 'small'"),
        ({"slowdown_ratio": -1}, "expected a number >= 0, got -1"),
        ({"clear_after": True}, "expected a number, got True"),
    ],
)
def test_bad_threshold_values_say_what_was_expected(config: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        DiagnosisEngine(config)


def test_every_threshold_is_documented_in_diagnoses_md() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "DIAGNOSES.md").read_text(encoding="utf-8")
    missing = [name for name in THRESHOLDS if f"`{name}`" not in doc]
    assert missing == []


def test_the_thresholds_table_of_diagnoses_md_holds_the_codes_defaults() -> None:
    """Each row of the doc's table, `name` | default, is the default in thresholds.py."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "DIAGNOSES.md").read_text(encoding="utf-8")
    table = doc.split("## Thresholds", 1)[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", table, re.MULTILINE))
    assert set(rows) == set(THRESHOLDS)
    wrong = {name: (rows[name], default) for name, (default, _) in THRESHOLDS.items()
             if float(rows[name]) != default}
    assert wrong == {}, "docs/DIAGNOSES.md (doc, code): " + repr(wrong)
    # the prose names them with their default too: "`spike_z` (6)", "`graph_min_points`, 4"
    prose = " ".join(doc.split("## Thresholds", 1)[0].split())
    quoted = re.findall(r"`(\w+)`(?: \(|, )(\d(?:[\d.e-]*\d)?)", prose)
    wrong_in_prose = [(name, value) for name, value in quoted
                      if name in THRESHOLDS and float(value) != THRESHOLDS[name][0]]
    assert len(quoted) > 30 and wrong_in_prose == []


def test_alert_is_raised_once_updated_sparingly_and_cleared_after_it_stops() -> None:
    engine = DiagnosisEngine({"update_every": 5, "clear_after": 3})
    alerts: list[dict[str, Any]] = []
    for n in range(12):  # a NaN loss on every step: one alert, not twelve
        alerts += engine.observe(step(n, loss="NaN"))
    for n in range(12, 16):
        alerts += engine.observe(step(n, loss=0.5))
    states = [(a["state"], a["step"]) for a in alerts]
    assert states == [("raised", 0), ("updated", 5), ("updated", 10), ("cleared", 14)]
    assert all((a["code"], a["subject"]) == ("nonfinite", "loss") for a in alerts)
    assert engine.active == []


def test_a_light_step_without_data_does_not_clear_an_alert() -> None:
    engine = DiagnosisEngine({"clear_after": 1, "raise_after": 1})
    vanishing = {"lstm": {"input": [1e-30] * 90 + [1.0] * 31}}
    assert [a["state"] for a in engine.observe(step(0, timesteps=vanishing))] == ["raised"]
    for n in range(1, 5):  # cheap steps: no timesteps field, nothing judged
        assert engine.observe(step(n, duration_s=0.01)) == []
    assert engine.active == [("vanishing", "lstm")]


def test_alert_records_have_every_protocol_field_and_survive_the_codec() -> None:
    engine = DiagnosisEngine()
    (alert,) = engine.observe(step(4, loss=math.inf, nonfinite={"parameters": ["fc.weight"]}))
    assert set(alert) == set(m.AlertRecord.__annotations__)
    assert alert["kind"] == "alert" and alert["code"] in m.ALERT_CODES
    assert alert["severity"] in m.SEVERITIES and alert["state"] in m.ALERT_STATES
    assert alert["subject"] == "fc" and alert["step"] == 4 and alert["t"] == 1004.0
    assert "fc.weight" in alert["message"] and "clip_grad_norm_" in alert["hint"]
    assert loads(dumps(alert)) == alert


def test_records_of_other_kinds_are_ignored() -> None:
    engine = DiagnosisEngine()
    assert engine.observe({"kind": "end", "status": "finished", "step": 3}) == []
    assert engine.observe({"kind": "epoch", "epoch": 0, "step": 3, "t": 0.0}) == []


def test_a_failing_detector_warns_once_and_the_others_carry_on() -> None:
    class Broken(Detector):
        code = "slowdown"

        def observe(self, record: Any) -> Verdicts:
            raise KeyError("boom")

    engine = DiagnosisEngine()
    engine.detectors.insert(0, Broken(engine.config))
    with pytest.warns(GradwatchWarning, match="slowdown diagnosis failed.*boom"):
        first = engine.observe(step(0, loss="NaN"))
    assert [a["code"] for a in first] == ["nonfinite"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.observe(step(1, loss="NaN"))  # no second warning


def test_finish_reports_evidence_that_moved_since_the_last_record() -> None:
    engine = DiagnosisEngine({"update_every": 100})
    engine.observe(step(0, loss="NaN"))
    engine.observe(step(1, loss="NaN"))
    (last,) = engine.finish()
    assert last["state"] == "updated" and last["evidence"]["step"] == 1
    assert engine.finish() == []


VANISHING = {"lstm": {"input": [1e-30] * 90 + [1.0] * 31}}
HEALTHY = {"lstm": {"input": [1.0] * 121}}


def test_a_condition_is_raised_only_once_it_held_raise_after_judgements_in_a_row() -> None:
    engine = DiagnosisEngine({"raise_after": 3, "clear_after": 3})
    pattern = [VANISHING, VANISHING, HEALTHY, VANISHING, VANISHING, VANISHING, VANISHING]
    pattern += [HEALTHY, VANISHING, HEALTHY, HEALTHY, HEALTHY]
    seen = []
    for n, ts in enumerate(pattern):
        seen += [(a["state"], a["step"]) for a in engine.observe(step(n, timesteps=ts))]
    # two in a row are not sustained; the third in a row raises; one healthy step
    # between bad ones does not clear; three in a row do
    assert seen == [("raised", 5), ("cleared", 11)]


def test_events_that_are_no_matter_of_noise_are_raised_at_once() -> None:
    (alert,) = DiagnosisEngine({"raise_after": 10}).observe(step(0, loss="NaN"))
    assert (alert["code"], alert["state"]) == ("nonfinite", "raised")


def test_alerts_of_one_cause_are_one_problem_and_only_its_first_record_opens_it() -> None:
    engine = DiagnosisEngine({"raise_after": 1})
    stale = [
        {"kind": "alert", "step": 3, "code": "graph_growth", "state": "raised", "subject": s}
        for s in ("lstm1", "lstm2", "lstm3")
    ]
    for a in stale:  # the capture's own alerts travel through the engine
        assert engine.observe(a) == []
    assert [(a["problem"], a["opens_problem"]) for a in stale] == [
        ("graph_growth", True),
        ("graph_growth", False),
        ("graph_growth", False),
    ]
    alerts = []
    for n in range(12):
        alerts += engine.observe(step(n, graph_nodes=100 * (n + 1)))
    graph = [a for a in alerts if a["subject"] == "graph"]
    assert graph and all(a["problem"] == "graph_growth" and not a["opens_problem"] for a in graph)
    (vanishing,) = engine.observe(step(12, timesteps=VANISHING))
    assert vanishing["problem"] == "vanishing:lstm" and vanishing["opens_problem"] is True


def test_no_gradient_is_said_once_plainly_never_as_exploding_and_vanishing() -> None:
    engine = DiagnosisEngine()
    alerts = []
    for n in range(4):  # a run that trains
        ts = {"cell": {"hidden": [0.1 * 0.97**k for k in range(40)]}}
        alerts += engine.observe(step(n, loss=0.7, total_norm=0.5, timesteps=ts))
    for n in range(4, 12):  # then the loss collapses to 0: 4e-26 at timestep 0, 4e-40 last
        ts = {"cell": {"hidden": [4e-26 * 0.1 ** (14 * k / 39) for k in range(40)]}}
        alerts += engine.observe(step(n, loss=0.0, total_norm=1.2e-22, timesteps=ts))
    raised = [(a["code"], a["subject"]) for a in alerts if a["state"] == "raised"]
    assert sorted(raised) == [("no_gradient", "cell"), ("no_gradient", "model")]
    assert [a["opens_problem"] for a in alerts if a["state"] == "raised"].count(True) == 1
    cell = next(a for a in alerts if a["subject"] == "cell")
    assert cell["message"].startswith("no gradient reaches cell: loss is 0")
    assert cell["step"] == 6 and cell["evidence"]["peak"] == 0.1


def test_no_gradient_is_silent_on_gradients_that_shrink_as_a_run_learns() -> None:
    engine = DiagnosisEngine()
    alerts = []
    for n in range(300):  # the total norm falls 1000x over the run: learning, not noise
        alerts += engine.observe(step(n, loss=1.0 / (n + 1), total_norm=0.5 * 0.977**n))
    assert alerts == []
