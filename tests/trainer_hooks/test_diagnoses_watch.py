"""The diagnoses inside watch(): real training loops, alerts read back from the spool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


def alerts_in(path: Path) -> list[dict[str, Any]]:
    return [
        r
        for m in read_spool(path)
        if m["type"] == "batch"
        for r in m["records"]
        if r["kind"] == "alert"
    ]


def test_watch_refuses_an_unknown_threshold_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"got 'vanishing'; known: .*vanishing_factor"):
        watch(torch.nn.Linear(2, 2), spool=tmp_path / "x.jsonl", thresholds={"vanishing": 1})


def test_nonfinite_alert_names_the_first_bad_parameter_and_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    spool = tmp_path / "nan.jsonl"
    with watch(model, run="nan", every=1, spool=spool) as monitor:
        for step in range(6):
            if step == 3:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
            loss = model(torch.randn(8, 3)).square().mean()
            model.zero_grad()
            loss.backward()
            monitor.step(loss)
    step3 = next(
        r
        for m in read_spool(spool)
        if m["type"] == "batch"
        for r in m["records"]
        if r["kind"] == "step" and r["step"] == 3
    )
    listed = step3["nonfinite"]["parameters"]  # in the order backward produced them
    assert sorted(listed) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    raised = [a for a in alerts_in(spool) if a["state"] == "raised"]
    owner = listed[0].rpartition(".")[0]
    assert [(a["code"], a["subject"], a["step"]) for a in raised] == [("nonfinite", owner, 3)]
    assert raised[0]["evidence"]["first_parameter"] == listed[0]
    assert raised[0]["evidence"]["count"] == 4 and raised[0]["evidence"]["loss"] == "nan"
    assert "detect_anomaly" in raised[0]["hint"]


def test_exploding_alert_suggests_a_clip_value_from_the_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    spool = tmp_path / "boom.jsonl"
    with watch(model, run="boom", every=1, spool=spool) as monitor:
        for step in range(12):
            scale = 1e4 if step == 10 else 1.0  # one batch with wild inputs
            loss = model(scale * torch.randn(16, 4)).square().mean()
            model.zero_grad()
            loss.backward()
            monitor.step(loss)
    # only exploding's alerts: slowdown also judges this run's step times, and a busy
    # machine is no business of this test (test_false_alarms.py judges that)
    (alert,) = [a for a in alerts_in(spool) if a["state"] == "raised" and a["code"] == "exploding"]
    assert (alert["code"], alert["subject"], alert["step"]) == ("exploding", "total_norm", 10)
    clip = alert["evidence"]["clip"]
    assert 0 < clip < alert["evidence"]["total_norm"] / 100
    assert f"max_norm={clip:.3g}" in alert["hint"]


@pytest.mark.parametrize("diagnose", [True, False])
def test_diagnose_switch_turns_the_vanishing_alert_on_and_off(
    tmp_path: Path, diagnose: bool
) -> None:
    torch.manual_seed(0)
    model = torch.nn.LSTM(1, 8, batch_first=True)
    spool = tmp_path / "switch.jsonl"
    with watch(model, run="switch", every=1, spool=spool, diagnose=diagnose) as monitor:
        for _ in range(3):  # raised once it held three steps in a row (raise_after)
            out, _ = model(torch.randn(4, 121, 1))
            loss = out[:, -1].sum()  # the loss on the last of 121 timesteps
            model.zero_grad()
            loss.backward()
            monitor.step(loss)
    codes = [(a["code"], a["subject"]) for a in alerts_in(spool)]
    # the watched model itself has the empty name; the capture calls it by its class
    assert codes == ([("vanishing", "LSTM")] if diagnose else [])
