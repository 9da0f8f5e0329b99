"""The diagnoses say exactly what they said before their light-record paths got faster.

``light_sequences.py`` makes seeded runs of light and heavy step records with the
problems the detectors look for; the alerts the engine emits over all of them are
pinned here (their JSON's SHA-256, taken from the engine before the fast paths, and
the alerts' codes and states). A deliberate change to what a diagnosis says updates
both, with the reason in the commit; a speed-up must leave them as they are.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import pytest

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine

from .light_sequences import SCENARIOS, scenario

#: sha256 of the alerts of every scenario x seeds 0-2 (see the module docstring)
PINNED = "89e09e26749b55495c64756b52ac1393a84cac15f165b0ef13dc11ef5f998696"


def alerts_of(records: Any) -> list[dict[str, Any]]:
    engine = DiagnosisEngine()
    alerts: list[dict[str, Any]] = []
    for record in records:
        alerts += engine.observe(record)
    return alerts + engine.finish()


def test_alerts_on_the_recorded_sequences_are_unchanged() -> None:
    out = {f"{name}:{seed}": alerts_of(scenario(name, seed=seed))
           for name in SCENARIOS for seed in range(3)}
    states = Counter((a["code"], a["state"]) for alerts in out.values() for a in alerts)
    # every detector that judges light records speaks somewhere in these runs
    assert {code for code, state in states if state == "raised"} == {
        "spike", "nonfinite", "slowdown", "exploding", "vanishing"
    }
    text = json.dumps(out, sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_nonfinite_fast_path_says_what_the_full_reading_says(name: str) -> None:
    """An empty ``nonfinite`` field sends every record down the full reading; the
    alerts must be those of the records without it (the fast path)."""
    records = list(scenario(name, steps=400))
    full = [{**r, "nonfinite": {}} if r["kind"] == "step" else r for r in records]
    assert alerts_of(full) == alerts_of(records)
