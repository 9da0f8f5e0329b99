"""``spike``: a poisoned batch raises at its step, names the first block in backward
order, clears back in band; healthy noise and trends raise nothing."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def alerts_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
        if r["kind"] == "alert"
    ]


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


class Net(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.blocks = nn.ModuleList([Residual(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def train(path: Path, steps: int, poison: int | None, seed: int) -> None:
    """A regression with SGD; at ``poison`` the targets come 10x off (a units bug)."""
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    w = torch.randn(4, 1)
    with watch(model, run="spike", every=1, spool=path) as monitor:
        for step in range(steps):
            x = torch.randn(32, 4)
            y = x @ w + 0.1 * torch.randn(32, 1)
            if step == poison:
                y = y * 10.0
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)


def test_a_poisoned_batch_raises_spike_at_its_step_naming_the_last_block(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    train(path, steps=200, poison=60, seed=0)
    spikes = [a for a in alerts_of(path) if a["code"] == "spike"]
    raised = [(a["subject"], a["step"]) for a in spikes if a["state"] == "raised"]
    assert sorted(raised) == [("blocks", 60), ("loss", 60)]
    blocks = next(a for a in spikes if a["subject"] == "blocks")
    # backward reaches the last block first: that is where the spike entered the stack
    assert blocks["evidence"]["first_block"] == 3 and blocks["evidence"]["blocks"] == 4
    assert "first at block 3 of 4 in backward order" in blocks["message"]
    loss = next(a for a in spikes if a["subject"] == "loss")
    assert loss["evidence"]["first_stack"] == "blocks" and loss["evidence"]["first_block"] == 3
    assert loss["problem"] == blocks["problem"] == "spike"
    assert [a["opens_problem"] for a in spikes if a["state"] == "raised"].count(True) == 1
    # knocked off by the bad step, the model takes a while to come back into its band
    cleared = {a["subject"]: a["step"] for a in spikes if a["state"] == "cleared"}
    assert set(cleared) == {"blocks", "loss"} and min(cleared.values()) > 63


def test_a_spike_clears_after_three_judgements_back_in_band() -> None:
    values = [1.0 + 0.01 * (i % 5) for i in range(40)] + [9.0] + [1.0] * 5
    alerts = feed(DiagnosisEngine(), values)
    assert [(a["state"], a["step"]) for a in alerts] == [("raised", 40), ("cleared", 43)]
    assert "since step 41" in alerts[1]["message"]


@pytest.mark.slow
def test_the_healthy_twin_raises_no_spike_over_500_steps(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    train(path, steps=500, poison=None, seed=0)
    assert [a for a in alerts_of(path) if a["code"] == "spike"] == []


def feed(engine: DiagnosisEngine, values: list[float], depth: list[list[float]] | None = None
         ) -> list[dict[str, Any]]:
    out = []
    for step, value in enumerate(values):
        record: dict[str, Any] = {"kind": "step", "step": step, "t": float(step), "loss": value}
        if depth is not None:
            record["depth"] = {"layers": depth[step]}
        out += engine.observe(record)
    return out


def test_noise_trends_and_falling_losses_raise_nothing() -> None:
    rng = random.Random(0)
    heavy_tailed = [2.0 + abs(rng.gauss(0, 0.1)) * rng.choice([1, 1, 1, 3]) for _ in range(600)]
    rising = [0.01 * (1 + step / 50) * (1 + rng.gauss(0, 0.05)) for step in range(600)]
    falling = [5.0 * 0.99**step + rng.gauss(0, 0.05) for step in range(600)]
    for series in (heavy_tailed, rising, falling):
        assert feed(DiagnosisEngine(), series) == []
    constant = [1.0] * 100 + [1.2]  # no spread, but only 20% above: not a spike
    assert feed(DiagnosisEngine(), constant) == []


def test_the_band_needs_history_and_thresholds_are_respected() -> None:
    early = [1.0] * 10 + [50.0]  # 10 values are no band
    assert feed(DiagnosisEngine(), early) == []
    values = [1.0 + 0.01 * (i % 5) for i in range(40)] + [1.4]
    assert feed(DiagnosisEngine(), values) == []  # robust z ~30, but only 1.4x
    (alert,) = feed(DiagnosisEngine({"spike_min_rise": 0.3}), values)
    assert (alert["code"], alert["subject"], alert["step"]) == ("spike", "loss", 40)


def test_first_block_in_backward_order_is_the_highest_that_spiked() -> None:
    depth = [[1.0, 1.0, 1.0, 1.0] for _ in range(30)]
    depth.append([1.0, 9.0, 8.0, 1.0])  # blocks 1 and 2 spike; 3 (the top) does not
    alerts = feed(DiagnosisEngine(), [1.0] * 31, depth)
    (alert,) = alerts
    assert alert["subject"] == "layers" and alert["evidence"]["first_block"] == 2
    assert alert["evidence"]["spiked_blocks"] == [2, 1]


def test_the_sorted_window_gives_the_median_of_the_last_values() -> None:
    from gradwatch.trainer_hooks.diagnoses.base import median
    from gradwatch.trainer_hooks.diagnoses.spike import Band

    rng = random.Random(1)
    band = Band(window=37, min_history=1, z=6.0, min_rise=0.5)
    seen: list[float] = []
    for _ in range(500):
        value = rng.choice([rng.random(), 0.5, 1.0])  # repeats: removal must find them
        band.judge(value)
        seen.append(value)
        assert band.median() == median(seen[-37:])
        assert sorted(band.values) == sorted(seen[-37:])


def test_far_above_everything_in_a_wide_early_band_is_a_spike() -> None:
    falling = [2.5 * 0.8**step for step in range(25)]  # early training: a wide log band
    values = [*falling, 4789.0]
    (alert,) = feed(DiagnosisEngine(), values)
    assert (alert["subject"], alert["step"]) == ("loss", 25)
    assert alert["evidence"]["z"] < 6  # the z-score alone would have missed it
    assert feed(DiagnosisEngine({"spike_over_max": 1e6}), values) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_loss_with_two_modes_spikes_only_above_both(seed: int) -> None:
    """A seq2seq loss summed over the target with teacher forcing half the time: some
    steps near 6.6, the others anywhere in 12-32. The band's MAD is its lower mode's,
    so values of the upper mode had robust z-scores of 7-45 and raised spikes; only a
    value above both modes is one."""
    rng = random.Random(seed)
    values = [rng.uniform(6.5, 6.7) if rng.random() < 0.55 else rng.uniform(12.0, 32.0)
              for _ in range(300)]
    assert feed(DiagnosisEngine(), values) == []
    alerts = feed(DiagnosisEngine(), [*values, 75.0])
    assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [("spike", "loss", 300)]


def test_blips_of_a_converged_loss_near_zero_are_no_spike() -> None:
    """A classifier that gets every example right: its loss falls from ~1 to ~1e-4,
    with blips 10x its median now and then (tiny in nats, large on a log scale). A
    real jump, to a few tenths, still spikes."""
    rng = random.Random(3)
    falling = [1.0 * 0.9**step for step in range(90)]
    converged = [1e-4 * math.exp(rng.gauss(0, 0.3)) * (10 if step % 37 == 0 else 1)
                 for step in range(400)]
    values = [*falling, *converged]
    assert feed(DiagnosisEngine(), values) == []
    alerts = feed(DiagnosisEngine(), [*values, 0.3])
    assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [("spike", "loss", 490)]


def test_a_huge_spike_does_not_hide_the_next_smaller_one() -> None:
    """The loss's level is its band's median, not its largest value: after a loss of
    350,000 (rnn_long_batches' long batch) a later one of 150 still spikes."""
    rng = random.Random(5)
    values = [4.4 * math.exp(rng.gauss(0, 0.1)) for _ in range(160)]
    values[60], values[110] = 350_000.0, 150.0
    alerts = feed(DiagnosisEngine(), values)
    raised = [(a["subject"], a["step"]) for a in alerts if a["state"] == "raised"]
    assert raised == [("loss", 60), ("loss", 110)]
