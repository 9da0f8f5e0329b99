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


NORMS = [1.0, 1.2, 0.9, 1.1, 1.3, 1.0, 0.8, 1.4, 1.2, 1.1]
LOSSES = [2.0, 1.9, 2.1, 1.8, 1.7, 1.9, 1.6, 1.8, 1.5, 1.7]


def test_exploding_over_steps_is_raised_when_the_spiked_update_wrecks_the_loss() -> None:
    engine = DiagnosisEngine()
    for n, (v, loss) in enumerate(zip(NORMS, LOSSES, strict=True)):
        assert engine.observe(step(n, total_norm=v, loss=loss)) == []
    # the spike: its own loss was computed before the update, so no evidence yet
    assert engine.observe(step(10, total_norm=400.0, loss=1.6)) == []
    (alert,) = engine.observe(step(11, total_norm=3000.0, loss=250.0))
    assert (alert["code"], alert["subject"], alert["step"]) == ("exploding", "total_norm", 11)
    ev = alert["evidence"]
    assert (ev["spike_step"], ev["loss_step"], ev["loss_band"]) == (10, 11, [1.5, 2.1])
    assert ev["loss_ceiling"] == pytest.approx(2.1 + 2.1)  # above twice the highest
    # the clip comes from the steps before the spike, not from the exploded ones
    expected_clip = sorted(NORMS)[8] + 0.1 * (sorted(NORMS)[9] - sorted(NORMS)[8])  # 90th pct
    assert ev["clip"] == pytest.approx(expected_clip, rel=1e-2)
    assert f"max_norm={ev['clip']:.3g}" in alert["hint"]
    assert "400" in alert["message"] and "250" in alert["message"]


@pytest.mark.parametrize("after", [[1.7, 1.9, 1.8, 2.0, 1.6, 1.7, 1.8], [3.9] * 7])
def test_a_spike_whose_loss_stays_in_its_band_is_not_exploding(after: list[float]) -> None:
    # Adam moves each weight by about lr whatever the gradient: the run absorbs it;
    # a loss that rises but stays under twice its recent highest is no wreck either
    engine = DiagnosisEngine({"raise_after": 1})
    records = [
        step(n, total_norm=v, loss=loss)
        for n, (v, loss) in enumerate(zip(NORMS, LOSSES, strict=True))
    ]
    records += [step(10, total_norm=400.0, loss=1.6), step(11, total_norm=150.0, loss=after[0])]
    records += [step(12 + k, total_norm=1.0, loss=loss) for k, loss in enumerate(after[1:])]
    # and once the harm window (5 steps) has passed, a late bad loss is not blamed on it
    records += [step(19, total_norm=1.0, loss=500.0)]
    assert [a for r in records for a in engine.observe(r)] == []


def test_a_non_finite_loss_after_a_spike_is_harm_and_the_alert_holds_while_wrecked() -> None:
    engine = DiagnosisEngine({"update_every": 1000})
    alerts = []
    for n, (v, loss) in enumerate(zip(NORMS, LOSSES, strict=True)):
        alerts += engine.observe(step(n, total_norm=v, loss=loss))
    alerts += engine.observe(step(10, total_norm=400.0, loss=1.6))
    alerts += engine.observe(step(11, total_norm=5e4, loss="NaN"))
    (wrecked,) = [a for a in alerts if a["code"] == "exploding"]  # and nonfinite on the loss
    assert "the loss went nan at step 11" in wrecked["message"]
    # the run stays wrecked for 30 steps: the norms fill the window, and the band and
    # median frozen at the spike keep the alert raised (no clear, no second raise)
    for n in range(12, 42):
        alerts += engine.observe(step(n, total_norm=5e4 * n, loss=1e6 * n))
    # recovered: cleared after clear_after (10) recorded steps
    for n in range(42, 60):
        alerts += engine.observe(step(n, total_norm=1.0, loss=1.8))
    states = [(a["code"], a["state"], a["step"]) for a in alerts if a["code"] == "exploding"]
    assert states == [("exploding", "raised", 11), ("exploding", "cleared", 51)]


@pytest.mark.parametrize("every", [1, 10])
def test_without_a_loss_a_spike_must_be_sustained(every: int) -> None:
    # recorded steps `every` apart (watch(every=10)): sustained counts recorded steps
    engine = DiagnosisEngine()
    norms = NORMS + [400.0, 1.0] + [1.0] * 8 + [500.0, 900.0]
    for n, v in enumerate(norms):
        # one spike then back (steps 10-11): nothing shows harm, and it did not hold
        assert engine.observe(step(every * n, total_norm=v)) == [], n
    # three recorded steps in a row at 50x the median before: raised on the third
    (alert,) = engine.observe(step(every * len(norms), total_norm=800.0))
    assert alert["step"] == every * 22
    assert alert["evidence"]["sustained_steps"] == 3 and "no loss" in alert["message"]


def test_exploding_waits_for_history_before_judging_steps() -> None:
    engine = DiagnosisEngine({"raise_after": 1})
    assert engine.observe(step(0, total_norm=1.0, loss=1.0)) == []
    assert engine.observe(step(1, total_norm=1e6, loss=1.0)) == []  # one value is no baseline
    assert engine.observe(step(2, total_norm=1e6, loss=1e9)) == []


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


def test_light_steps_between_captured_ones_never_clear_a_nonfinite_gradient() -> None:
    # A parameter whose gradient is inf on every step (sqrt at 0) while the loop skips
    # its update: the loss stays finite. Under the default budget one step in 20-90
    # is captured; the light ones carry a loss and no gradient.
    engine = DiagnosisEngine()
    alerts = []
    for n in range(300):
        captured = n % 25 == 0
        fields: dict[str, Any] = {"loss": 2.0 - n / 1000, "duration_s": 0.003}
        if captured:
            fields.update(total_norm=float("inf"), param_norms={"gain": "inf", "fc.weight": 0.4},
                          nonfinite={"parameters": ["gain"]})
        alerts += engine.observe(step(n, **fields))
    states = [(a["subject"], a["state"]) for a in alerts if a["code"] == "nonfinite"]
    assert states[0] == ("gain", "raised")
    assert ("gain", "cleared") not in states
    # a captured step with finite gradients does judge it: clear_after of them clear it
    later = []
    for n in range(300, 600):
        fields = {"loss": 1.5, "duration_s": 0.003}
        if n % 25 == 0:
            fields.update(total_norm=0.5, param_norms={"gain": 0.1, "fc.weight": 0.4})
        later += engine.observe(step(n, **fields))
    (cleared,) = [a for a in later if a["code"] == "nonfinite"]
    assert (cleared["subject"], cleared["state"]) == ("gain", "cleared")
    assert cleared["step"] == 300 + 25 * (engine.config["clear_after"] - 1)


def test_a_nan_loss_is_cleared_by_the_light_steps_that_follow_it() -> None:
    # every record carries the loss: light steps judge it, unlike the gradients
    engine = DiagnosisEngine({"clear_after": 3})
    alerts = []
    for n in range(20):
        loss = float("nan") if n == 5 else 1.0
        alerts += engine.observe(step(n, loss=loss, duration_s=0.003))
    assert [(a["subject"], a["state"], a["step"]) for a in alerts if a["code"] == "nonfinite"] == [
        ("loss", "raised", 5), ("loss", "cleared", 8)]
