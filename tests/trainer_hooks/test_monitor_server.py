"""watch(model, server=...) end to end: a real `gradwatch serve`, its REST answers."""

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


class Carrier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTM(3, 6)
        self.head = nn.Linear(6, 1)
        self.hidden: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, self.hidden = self.lstm1(x, self.hidden)  # never detached: the bug
        return self.head(out)


def test_a_watched_run_streams_to_a_real_server(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    torch.manual_seed(0)
    model = Carrier()
    monitor = watch(
        model, run="streamed", server=server.url, spool=tmp_path / "outbox.jsonl", every=1,
        diagnose=False,
    )
    for _ in range(2):
        for _ in range(3):
            loss = model(torch.randn(4, 1, 3)).pow(2).mean()
            loss.backward(retain_graph=True)
            monitor.step(loss)
        monitor.epoch()
    assert monitor.close(timeout=30)

    run = get(f"{server.http}/api/runs/{monitor.run_id}")
    assert run["name"] == "streamed" and run["status"] == "finished"
    assert run["last_step"] == 5 and run["recurrent"] == ["lstm1"]
    steps = get(f"{server.http}/api/runs/{monitor.run_id}/steps?fields=loss,graph_nodes")
    assert steps["fields"]["loss"]["step"] == [0, 1, 2, 3, 4, 5]
    nodes = steps["fields"]["graph_nodes"]["value"]
    assert nodes == sorted(nodes) and nodes[-1] > nodes[0]
    epochs = get(f"{server.http}/api/runs/{monitor.run_id}/epochs")
    assert [(e["epoch"], e["step"], e["steps"]) for e in epochs] == [(0, 2, 3), (1, 5, 3)]
    alerts = get(f"{server.http}/api/runs/{monitor.run_id}/alerts")
    assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [
        ("graph_growth", "lstm1", 1)
    ]
    heatmap = get(f"{server.http}/api/runs/{monitor.run_id}/timesteps?module=lstm1")
    assert heatmap["steps"] == [0, 1, 2, 3, 4, 5] and heatmap["max_timesteps"] == 4
