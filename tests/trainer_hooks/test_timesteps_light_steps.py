"""Light steps (``every=N``) leave cell loops unhooked; heavy steps capture in full."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(3, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], 5)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(self.head(h))
        return torch.stack(outs)


def test_cell_forward_hook_is_on_only_for_heavy_steps_and_gone_after_remove(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = Decoder()
    path = tmp_path / "light.jsonl"
    hooked: list[int] = []
    with watch(model, run="light", spool=path, every=3, diagnose=False) as monitor:
        for _ in range(7):
            hooked.append(len(model.cell._forward_hooks))  # during this step's forward
            loss = model(torch.randn(6, 2, 3)).pow(2).mean()
            loss.backward()
            monitor.step(loss)
        monitor.remove()
        assert len(model.cell._forward_hooks) == 0
        assert len(model.cell._forward_pre_hooks) == 0
    assert hooked == [1, 0, 0, 1, 0, 0, 1]
    records: list[dict[str, Any]] = [
        r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
        if r["kind"] == "step"
    ]
    series = {r["step"]: r.get("timesteps", {}).get("cell", {}) for r in records}
    for step in range(7):
        if step % 3 == 0:
            assert len(series[step]["hidden"]) == 6 and len(series[step]["cell"]) == 6
        else:
            assert series[step] == {}
