"""exploding and nonfinite: growth through time and over steps, and where NaN starts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def step(n: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), **fields}


def rnn_input_grad_norms(scale: float, timesteps: int = 60) -> list[float]:
    """‖∂L/∂x_t‖ of a linear RNN whose recurrent weight is ``scale`` × identity."""
    torch.manual_seed(0)
    rnn = torch.nn.RNN(2, 8, nonlinearity="relu", batch_first=True).double()
    with torch.no_grad():
        rnn.weight_hh_l0.copy_(scale * torch.eye(8, dtype=torch.float64))
        rnn.weight_ih_l0.abs_()
        rnn.bias_hh_l0.fill_(0.1)
    x = torch.rand(4, timesteps, 2, dtype=torch.float64, requires_grad=True)
    out, _ = rnn(x)
    out[:, -1].sum().backward()
    assert x.grad is not None
    return x.grad.square().sum(dim=(0, 2)).sqrt().tolist()


def test_exploding_through_time_on_a_real_rnn_with_recurrent_gain_above_one() -> None:
    norms = rnn_input_grad_norms(1.2)
    alerts = DiagnosisEngine({"raise_after": 1}).observe(
        step(0, timesteps={"rnn": {"input": norms}})
    )
    (alert,) = [a for a in alerts if a["code"] == "exploding"]
    assert alert["subject"] == "rnn" and alert["evidence"]["early_over_late"] > 1e3
    assert alert["evidence"]["growth_per_timestep"] == pytest.approx(1.2, rel=0.05)
    assert "clip_grad_norm_" in alert["hint"]


def test_exploding_is_silent_with_recurrent_gain_one() -> None:
    norms = rnn_input_grad_norms(1.0)
    assert (
        DiagnosisEngine({"raise_after": 1}).observe(step(0, timesteps={"rnn": {"input": norms}}))
        == []
    )


def test_exploding_over_steps_suggests_a_clip_value_from_recent_norms() -> None:
    engine = DiagnosisEngine({"raise_after": 1})
    norms = [1.0, 1.2, 0.9, 1.1, 1.3, 1.0, 0.8, 1.4, 1.2, 1.1]
    for n, v in enumerate(norms):
        assert engine.observe(step(n, total_norm=v)) == []
    (alert,) = engine.observe(step(10, total_norm=400.0))
    assert (alert["code"], alert["subject"]) == ("exploding", "total_norm")
    expected_clip = sorted(norms)[8] + 0.1 * (sorted(norms)[9] - sorted(norms)[8])  # 90th pct
    assert alert["evidence"]["clip"] == pytest.approx(expected_clip, rel=1e-2)
    assert f"max_norm={alert['evidence']['clip']:.3g}" in alert["hint"]
    assert "400" in alert["message"]


def test_exploding_waits_for_history_before_judging_steps() -> None:
    engine = DiagnosisEngine({"raise_after": 1})
    assert engine.observe(step(0, total_norm=1.0)) == []
    assert engine.observe(step(1, total_norm=1e6)) == []  # one earlier value is no baseline


def test_nonfinite_names_the_first_parameter_module_and_timestep() -> None:
    # A real model driven to overflow, its non-finite gradients named as the capture does.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        model[2].weight.fill_(3e38)
    model(torch.ones(2, 4)).pow(2).sum().backward()
    bad = [
        n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
    ]
    assert bad[0] == "0.weight"
    record = step(
        5,
        loss="Infinity",
        nonfinite={"parameters": bad, "timesteps": {"lstm": {"input": 37, "layer1": 12}}},
    )
    (alert,) = DiagnosisEngine({"raise_after": 1}).observe(record)
    ev = alert["evidence"]
    assert (alert["code"], alert["subject"], alert["severity"]) == ("nonfinite", "0", "error")
    assert ev["first_parameter"] == "0.weight" and ev["first_step"] == 5
    assert (ev["first_module"], ev["first_timestep"]) == ("lstm", 12)
    assert "0.weight" in alert["message"] and "timestep 12" in alert["message"]
    assert "detect_anomaly" in alert["hint"]


def test_nonfinite_remembers_the_first_step_while_it_holds() -> None:
    engine = DiagnosisEngine({"raise_after": 1, "update_every": 1})
    engine.observe(step(3, nonfinite={"parameters": ["enc.lstm.weight_hh_l0"]}))
    (update,) = engine.observe(step(4, nonfinite={"parameters": ["enc.lstm.weight_hh_l0"]}))
    assert update["subject"] == "enc.lstm" and update["state"] == "updated"
    assert update["evidence"]["first_step"] == 3 and "(first at step 3)" in update["message"]
