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
