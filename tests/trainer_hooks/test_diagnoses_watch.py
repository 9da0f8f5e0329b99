"""The diagnoses inside watch(): real training loops, alerts read back from the spool."""

from __future__ import annotations

import math
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


def wild_batch_run(tmp_path: Path, optimizer: str) -> list[dict[str, Any]]:
    """A linear model, one batch with wild inputs at step 10; the exploding alerts."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    spool = tmp_path / f"boom-{optimizer}.jsonl"
    with watch(model, run="boom", every=1, spool=spool) as monitor:
        for step in range(20):
            scale = 1e4 if step == 10 else 1.0  # one batch with wild inputs
            loss = (model(scale * torch.randn(16, 4)) - 1.0).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(loss)
    # only exploding's alerts: slowdown also judges this run's step times, and a busy
    # machine is no business of this test (test_false_alarms.py judges that)
    return [a for a in alerts_in(spool) if a["code"] == "exploding"]


def test_exploding_alert_suggests_a_clip_value_from_the_run(tmp_path: Path) -> None:
    # plain SGD: the wild batch's gradient moves the weights ~1e8x as far as usual, and
    # the next step's loss shows it: harm, raised on that step
    raised = [a for a in wild_batch_run(tmp_path, "sgd") if a["state"] == "raised"]
    (alert,) = raised
    assert (alert["code"], alert["subject"], alert["step"]) == ("exploding", "total_norm", 11)
    ev = alert["evidence"]
    assert ev["spike_step"] == 10 and ev["loss_step"] == 11 and ev["loss"] > ev["loss_ceiling"]
    clip = ev["clip"]
    assert 0 < clip < ev["total_norm"] / 100
    assert f"max_norm={clip:.3g}" in alert["hint"]
    assert "wrecked" in alert["message"]


def test_a_spike_the_optimizer_absorbs_is_not_exploding(tmp_path: Path) -> None:
    # the same wild batch under Adam: the update is ~lr per weight as on every step,
    # the loss stays in its band, and nothing was wrecked
    assert wild_batch_run(tmp_path, "adam") == []


def long_batch_rnn_run(tmp_path: Path, optimizer: str) -> tuple[list[dict[str, Any]], list[float]]:
    """A ReLU RNN with recurrent gain 1.05 on batches of 10 timesteps, and one of 80 at
    step 8 (a length bucket of a data loader): the gradient grows ~1.05 per timestep
    back, so that batch's is ~1e5x the others'. (exploding alerts, losses)."""
    torch.manual_seed(0)
    rnn = torch.nn.RNN(4, 16, nonlinearity="relu", batch_first=True)
    head = torch.nn.Linear(16, 1)
    with torch.no_grad():
        rnn.weight_hh_l0.copy_(1.05 * torch.eye(16))
    model = torch.nn.ModuleDict({"rnn": rnn, "head": head})
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    spool = tmp_path / f"rnn-{optimizer}.jsonl"
    losses = []
    # every=1: the default budget records norms on heavy steps only, and this spike
    # lives on one step (docs/CAPTURE.md, "What the budget leaves out")
    with watch(model, run="rnn", every=1, spool=spool) as monitor:
        for step in range(20):
            x = torch.randn(8, 80 if step == 8 else 10, 4)
            out, _ = rnn(x)
            loss = torch.nn.functional.mse_loss(head(out[:, -1]), x[:, -5:, 0].sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(loss)
            losses.append(loss.item())
    return [a for a in alerts_in(spool) if a["code"] == "exploding"], losses


def test_exploding_gradients_that_wreck_sgd_training_are_named_within_10_steps(
    tmp_path: Path,
) -> None:
    alerts, losses = long_batch_rnn_run(tmp_path, "sgd")
    assert max(losses[:8]) < 100 and not math.isfinite(sum(losses[9:]))  # it diverged
    raised = [a for a in alerts if a["state"] == "raised"]
    assert [(a["subject"], a["step"]) for a in raised] == [("total_norm", 9)]
    ev = raised[0]["evidence"]
    assert ev["spike_step"] == 8 and ev["ratio"] > 1e3 and ev["loss_step"] == 9


def test_the_same_spike_under_adam_trains_on_and_is_not_exploding(tmp_path: Path) -> None:
    alerts, losses = long_batch_rnn_run(tmp_path, "adam")
    assert math.isfinite(sum(losses)) and max(losses[10:]) < 100  # it trained on
    assert alerts == []


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
