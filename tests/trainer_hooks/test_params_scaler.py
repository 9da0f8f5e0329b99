"""With a GradScaler whose scale moves (grows every step, halves on an overflow), the
param norms stay the unscaled ones at every step: the scale is read each step, on the
device, never once and kept."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool, to_float
from gradwatch.trainer_hooks import watch


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r
        for m in read_spool(path)
        if m["type"] == "batch"
        for r in m["records"]
        if r["kind"] == "step"
    ]


def test_norms_stay_unscaled_while_the_scale_doubles_and_halves_on_overflow(
    tmp_path: Path,
) -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    # lr 0: the weights stay put, so each step's true norms follow from its input alone.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    overflow = 3
    inputs = [torch.randn(5, 3) * (1 + step) for step in range(7)]
    inputs[overflow] = inputs[overflow].clone()
    inputs[overflow][0, 0] = math.inf
    reference = []
    for x in inputs:
        model.zero_grad()
        model(x).pow(2).sum().backward()
        reference.append({n: p.grad.norm().item() for n, p in model.named_parameters()})  # type: ignore[union-attr]
    model.zero_grad()
    scales = []
    path = tmp_path / "run.jsonl"
    with watch(
        model, run="amp-moving", every=1, spool=path, scaler=scaler, diagnose=False
    ) as monitor:
        for x in inputs:
            scales.append(scaler.get_scale())
            loss = model(x).pow(2).sum()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            monitor.step(loss)
    # The run did what it is meant to test: the scale grew, then halved on the overflow.
    assert scales == [256.0, 512.0, 1024.0, 2048.0, 1024.0, 2048.0, 4096.0]
    records = steps_of(path)
    assert [r["step"] for r in records] == list(range(7))
    for step, record in enumerate(records):
        if step == overflow:
            assert not all(math.isfinite(to_float(v)) for v in record["param_norms"].values())
            continue
        assert record["param_norms"] == pytest.approx(reference[step], rel=1e-5), step


def alerts_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
            if r["kind"] == "alert"]


def train_fp16(path: Path, steps: int, pass_scaler: bool, blow_up: float = 1.0) -> list[bool]:
    """A healthy fp16 autocast run with a GradScaler that starts too high and grows
    every 5 steps; ``blow_up`` scales the loss (1e30: every step overflows). Returns
    which steps the scaler skipped."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=5)
    skipped = []
    options: dict[str, Any] = {"scaler": scaler} if pass_scaler else {}
    with watch(model, run="amp", every=1, spool=path, quiet=True, **options) as monitor:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(torch.randn(8, 16))
            loss = out.float().pow(2).mean() * blow_up
            opt.zero_grad()
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()  # monitor.step() after it: the step's scale is then known
            skipped.append(scaler.get_scale() < before)
            monitor.step(loss)
    return skipped


def test_the_overflows_a_gradscaler_skips_raise_no_alarm(tmp_path: Path) -> None:
    path = tmp_path / "amp.jsonl"
    skipped = train_fp16(path, 80, pass_scaler=True)
    # what the run is meant to show: a backoff from the start, then one overflow per growth
    assert sum(skipped[:20]) >= 5 and sum(skipped[20:]) >= 2
    assert alerts_of(path) == []
    records = steps_of(path)
    for record, skip in zip(records, skipped, strict=True):
        assert "nonfinite" not in record and "_scaler_skipped" not in record
        finite = all(math.isfinite(to_float(v)) for v in record["param_norms"].values())
        assert finite != skip  # the skipped steps' norms are still shown as they were


def test_without_the_scaler_the_same_overflows_are_nonfinite_with_the_way_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "amp.jsonl"
    train_fp16(path, 30, pass_scaler=False)
    raised = [a for a in alerts_of(path) if a["code"] == "nonfinite" and a["state"] == "raised"]
    assert raised and raised[0]["step"] == 0
    assert "watch(..., scaler=scaler)" in raised[0]["hint"]


def test_a_scaler_that_skips_every_step_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "amp.jsonl"
    skipped = train_fp16(path, 40, pass_scaler=True, blow_up=1e30)
    assert all(skipped)  # the gradients overflow at any scale: training has stopped
    raised = [a for a in alerts_of(path) if a["code"] == "nonfinite" and a["state"] == "raised"]
    # 24 skips in a row are a scaler finding its scale; the 25th is not
    assert [a["step"] for a in raised] == [24]
