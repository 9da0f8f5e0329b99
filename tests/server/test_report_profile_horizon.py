"""`gradwatch report`: the dashed line on the latest per-timestep profile is that
profile's own horizon (earliest timestep within 1e-3 of its peak), never the horizon of
a vanishing alert, which judged an older step (and here has cleared since)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from gradwatch.server.report_charts import horizon

TIMESTEPS = 121


def _vanishing_alert(step: int, state: str, horizon_t: int | None) -> dict[str, Any]:
    return {
        "kind": "alert", "step": step, "code": "vanishing", "severity": "warning",
        "state": state, "subject": "lstm1", "t": 1_764_460_000.0 + step,
        "message": "lstm1: gradient reaches back only 14 of 121 timesteps",
        "evidence": {} if horizon_t is None else {"horizon": horizon_t, "reach": 14},
    }  # fmt: skip


def _step(wire: Any, step: int, first: int) -> dict[str, Any]:
    """A step whose lstm1 profile has no gradient before timestep ``first``."""
    profile = [1e-12] * first + [1.0] * (TIMESTEPS - first)
    return wire.step(step, timesteps={"lstm1": {"input": profile}})


def _profile_figure(html: str) -> dict[str, Any]:
    found = re.search(r'id="gradwatch-figures">(.*?)</script>', html, re.S)
    assert found is not None
    return dict(json.loads(found.group(1))["chart-profile"])


def test_the_reports_profile_line_is_the_latest_profiles_own_horizon(
    gradwatch_server: Any, gradwatch_db: str, wire: Any, tmp_path: Path
) -> None:
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    # The loss on the last timestep: raised with horizon 107; then the gradient reaches
    # back to t = 30 and the alert clears.
    early = [_step(wire, s, 107) for s in range(5)] + [_vanishing_alert(4, "raised", 107)]
    late = [_step(wire, s, 30) for s in range(5, 10)] + [_vanishing_alert(9, "cleared", None)]
    acks = wire.send_run(server, run_id, [early, late, [{"kind": "end", "status": "finished",
                                                          "step": 9}]])  # fmt: skip
    assert [a["type"] for a in acks] == ["ack"] * 3
    out = tmp_path / "run.html"
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "report", run_id, "-o", str(out),
         "--db", server.db],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figure = _profile_figure(out.read_text(encoding="utf-8"))
    drawn = figure["data"][0]
    assert drawn["name"] == "lstm1" and len(drawn["y"]) == TIMESTEPS
    lines = [(t["name"], t["x"]) for t in figure["data"] if t["name"].startswith("horizon")]
    assert horizon(drawn["y"]) == 30
    assert lines == [("horizon lstm1: t = 30", [30, 30])]
