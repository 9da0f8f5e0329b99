"""A real server takes step records with ``depth`` and ``update_ratios`` and a ``spike``
alert: nothing refused, nothing repaired, the alert listed and counted, the depth
series and the ratios read back by stack and block."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwatch.trainer_hooks import watch


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback test server
        return json.loads(answer.read())


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.f(x))


def test_depth_update_ratios_and_spike_reach_a_real_server(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), *[Residual() for _ in range(3)], nn.Linear(8, 1))
    blocks = [model[1], model[2], model[3]]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = watch(model, run="depth", server=server.url, spool=tmp_path / "outbox.jsonl",
                    blocks=[{"trunk": blocks}], every=1, quiet=True)
    for step in range(30):
        x = torch.randn(16, 2)
        y = x.sum(1, keepdim=True) * (50.0 if step == 25 else 1.0)  # a bad batch at step 25
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        monitor.step(loss)
    # True: the server refused no batch and left no field out of any record
    assert monitor.close(timeout=30)
    sink = monitor._pipeline.sink
    assert sink.stats()["rejected_batches"] == 0 and sink.stats()["repaired_batches"] == 0
    alerts = get(f"{server.http}/api/runs/{monitor.run_id}/alerts")
    raised = {(a["code"], a["subject"], a["step"]) for a in alerts if a["state"] == "raised"}
    assert {("spike", "loss", 25), ("spike", "trunk", 25)} <= raised
    run = get(f"{server.http}/api/runs/{monitor.run_id}")
    assert run["alerts"] >= 1 and run["last_step"] == 29
    # Read back: the named stack's blocks by their module names, a row per step, and
    # the ratios summed up per block (the trunk's blocks, then the other modules).
    assert run["depth"] == ["trunk"]
    heat = get(f"{server.http}/api/runs/{monitor.run_id}/depth?stack=trunk")
    assert heat["blocks"] == ["1", "2", "3"] and heat["steps"] == list(range(30))
    assert all(len(row) == 3 and min(row) > 0 for row in heat["values"])
    ratios = get(f"{server.http}/api/runs/{monitor.run_id}/update_ratios")
    assert [b["name"] for b in ratios["blocks"]] == ["1", "2", "3", "0", "4"]
    assert ratios["blocks"][0]["parameters"] == ["1.f.bias", "1.f.weight"]
