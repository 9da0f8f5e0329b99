"""vanishing: the horizon of a real LSTM's ∂L/∂x_t, and the suggested truncation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
from gradwatch.trainer_hooks.diagnoses.vanishing import suggest_truncation


def input_grad_norms(timesteps: int, loss_on: str, seed: int = 0) -> list[float]:
    """‖∂L/∂x_t‖₂ per timestep of a fresh LSTM, from plain autograd, in float64."""
    torch.manual_seed(seed)
    lstm = torch.nn.LSTM(1, 32, batch_first=True).double()
    x = torch.randn(16, timesteps, 1, dtype=torch.float64, requires_grad=True)
    out, _ = lstm(x)
    pred = out.sum(-1)
    loss = pred[:, -1].square().mean() if loss_on == "last" else pred.square().mean()
    loss.backward()
    assert x.grad is not None
    return x.grad.square().sum(dim=(0, 2)).sqrt().tolist()


def step(n: int, timesteps: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": 0.0, "timesteps": timesteps}


def test_vanishing_fires_on_121_step_lstm_with_loss_on_last_step() -> None:
    norms = input_grad_norms(121, "last")
    (alert,) = DiagnosisEngine({"raise_after": 1}).observe(step(0, {"lstm": {"input": norms}}))
    ev = alert["evidence"]
    assert (alert["code"], alert["subject"], alert["state"]) == ("vanishing", "lstm", "raised")
    # The horizon is where the norm first reaches 1e-3 of the peak, checked independently.
    peak = max(norms)
    assert ev["horizon"] == min(t for t, v in enumerate(norms) if v >= 1e-3 * peak)
    assert ev["horizon"] > 60 and ev["reach"] == 121 - ev["horizon"]
    assert ev["suggested_truncation"] >= ev["reach"]
    assert ev["first_over_peak"] < 1e-6
    assert f"chunks of about {ev['suggested_truncation']} timesteps" in alert["hint"]
    assert f"only {ev['reach']} of 121 timesteps" in alert["message"]


@pytest.mark.parametrize(("timesteps", "loss_on"), [(121, "every"), (12, "last"), (20, "every")])
def test_vanishing_is_silent_on_healthy_sequences(timesteps: int, loss_on: str) -> None:
    norms = input_grad_norms(timesteps, loss_on)
    assert DiagnosisEngine({"raise_after": 1}).observe(step(0, {"lstm": {"input": norms}})) == []


def test_vanishing_reads_cell_series_and_nonfinite_strings_are_left_to_nonfinite() -> None:
    engine = DiagnosisEngine({"raise_after": 1})
    hidden = [0.0] * 30 + [10.0**-k for k in range(20, 0, -1)]
    (alert,) = engine.observe(step(0, {"decoder": {"hidden": hidden, "cell": [1.0] * 50}}))
    assert (
        alert["evidence"]["series"] == "hidden" and alert["evidence"]["horizon"] == 46
    )  # 1e-4 = 1e-3 x peak
    assert "∂L/∂h_t" in alert["message"]
    assert engine.observe(step(1, {"other": {"input": ["NaN"] + [1.0] * 40}})) == []


def test_vanishing_clears_when_the_gradient_reaches_back_again() -> None:
    engine = DiagnosisEngine({"raise_after": 1, "clear_after": 2})
    bad = {"lstm": {"input": input_grad_norms(121, "last")}}
    good = {"lstm": {"input": input_grad_norms(121, "every")}}
    states = [
        a["state"] for n, ts in enumerate([bad, good, good]) for a in engine.observe(step(n, ts))
    ]
    assert states == ["raised", "cleared"]


def test_vanishing_factor_is_configurable() -> None:
    norms = [0.5 ** (120 - t) for t in range(121)]  # halves per timestep back
    loose = DiagnosisEngine({"raise_after": 1, "vanishing_factor": 1e-40}).observe(
        step(0, {"m": {"input": norms}})
    )
    assert loose == []
    (alert,) = DiagnosisEngine({"raise_after": 1, "vanishing_factor": 1e-6}).observe(
        step(0, {"m": {"input": norms}})
    )
    assert alert["evidence"]["reach"] == 20  # 0.5**19 >= 1e-6 > 0.5**20
    assert alert["evidence"]["decay_per_timestep"] == pytest.approx(0.5)


def test_suggested_truncation_rounds_up_to_a_multiple_of_five() -> None:
    assert [suggest_truncation(r) for r in (1, 5, 6, 23, 40)] == [5, 5, 10, 25, 40]


@pytest.mark.parametrize(("layout", "judged"), [(None, True), ("chain", True), ("tree", False)])
def test_through_time_diagnoses_apply_only_where_timestep_layout_says_chain(
    layout: str | None, judged: bool
) -> None:
    vanishing = [1e-12] * 60 + [0.5**k for k in range(20, 0, -1)]
    exploding = [10.0 * 0.8**k for k in range(80)]
    engine = DiagnosisEngine()
    codes = []
    for n in range(3):  # raised on the third judgement in a row
        record = step(n, {"cell": {"hidden": vanishing}, "rnn": {"hidden": exploding}})
        if layout is not None:
            record["timestep_layout"] = {"cell": layout, "rnn": layout}
        codes += [(a["code"], a["subject"]) for a in engine.observe(record)]
    expected = [("vanishing", "cell"), ("exploding", "rnn")] if judged else []
    assert sorted(codes) == sorted(expected)


def test_a_horizon_hovering_at_the_threshold_does_not_flap() -> None:
    # 121 timesteps; the horizon spends 3 steps at 28% of the sequence, then 4 at 22%
    def series(horizon: int) -> list[float]:
        return [1e-9] * horizon + [1.0] * (121 - horizon)

    engine = DiagnosisEngine({"clear_after": 3})
    states = []
    for n in range(60):
        horizon = 34 if n % 7 < 3 else 27  # 0.28 raises; 0.22 < 0.25 but >= 0.1875
        states += [
            a["state"] for a in engine.observe(step(n, {"lstm": {"input": series(horizon)}}))
        ]
    assert states == ["raised"] + ["updated"] * (len(states) - 1)
    for n in range(60, 64):  # the gradient reaches back again: cleared after 3
        states += [a["state"] for a in engine.observe(step(n, {"lstm": {"input": series(5)}}))]
    assert states[-1] == "cleared"
