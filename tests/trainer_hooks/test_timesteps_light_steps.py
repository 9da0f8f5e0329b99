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


def test_the_cell_is_watched_only_on_heavy_steps_and_plain_after_remove(
    tmp_path: Path,
) -> None:
    # torch's own cell changes class on heavy steps (quantities/watched_class.py); a
    # cell class of the user's gets a forward hook instead
    torch.manual_seed(0)
    model = Decoder()
    path = tmp_path / "light.jsonl"
    watched: list[bool] = []
    with watch(model, run="light", spool=path, every=3, diagnose=False) as monitor:
        for _ in range(7):
            # during this step's forward
            watched.append(type(model.cell) is not nn.LSTMCell)
            assert not model.cell._forward_hooks
            loss = model(torch.randn(6, 2, 3)).pow(2).mean()
            loss.backward()
            monitor.step(loss)
        monitor.remove()
        assert type(model.cell) is nn.LSTMCell
        assert len(model.cell._forward_hooks) == 0
        assert len(model.cell._forward_pre_hooks) == 0
    assert watched == [True, False, False, True, False, False, True]
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


def test_steady_light_steps_skip_the_heavy_quantities_and_heavy_steps_stay_whole(
    tmp_path: Path,
) -> None:
    """A light step after a light step calls no quantity that is idle on light steps
    (their start/finish would only reset what a light step never fills); the first
    light step after a heavy one still resets them, and every heavy step captures as
    with every step watched."""
    torch.manual_seed(0)
    model = Decoder()
    path = tmp_path / "steady.jsonl"
    calls: list[tuple[int, str]] = []
    with watch(model, run="steady", spool=path, every=4, diagnose=False) as monitor:
        idle = [q for q in monitor.quantities if q.idle_when_light]
        assert {q.name for q in idle} >= {"param_norms", "timesteps", "update_ratios"}
        for q in idle:
            for method in ("start_step", "finish_step"):
                original = getattr(q, method)

                def spy(*args: Any, _o: Any = original, _m: str = method) -> Any:
                    calls.append((monitor.step_index, _m))
                    return _o(*args)

                setattr(q, method, spy)
        for _ in range(9):
            loss = model(torch.randn(6, 2, 3)).pow(2).mean()
            loss.backward()
            monitor.step(loss)
    per_step = {s: sorted({m for step, m in calls if step == s}) for s in range(10)}
    # step() of step s finishes s and starts s + 1 (step_index moves in between)
    finished = [s for s in range(9) if any(st == s and m == "finish_step" for st, m in calls)]
    started = [s for s in range(10) if any(st == s and m == "start_step" for st, m in calls)]
    assert finished == [0, 4, 8], per_step  # heavy steps only
    assert started == [1, 4, 5, 8, 9], per_step  # into a heavy step, and out of one
    records = [
        r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
        if r["kind"] == "step"
    ]
    for r in records:
        heavy = r["step"] % 4 == 0
        assert ("param_norms" in r) == heavy, r["step"]
        assert (len(r.get("timesteps", {}).get("cell", {}).get("hidden", [])) == 6) == heavy
